"""The compute_groups list: parsing from cdk.json and `-c` JSON, and errors naming group and key."""

from __future__ import annotations

import json

import pytest

from stacks.compute_groups import ComputeGroup
from stacks.config import HyperPodConfig, StackConfigError
from stacks.lint import is_error, lint_template

pytestmark = pytest.mark.xdist_group("infra")

PLAN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p5-reserved"
TRN = {"name": "trn", "instance_type": "ml.trn1.32xlarge", "partition": "trn1"}
GPU = {"name": "gpu", "instance_type": "ml.p5.48xlarge", "partition": "p5", "count": 4, "capacity": "spot"}


def parse(groups: object, **context: object) -> HyperPodConfig:
    return HyperPodConfig.from_context({"compute_groups": groups, **context}, environ={})


def test_a_list_and_its_json_text_parse_to_the_same_groups():
    as_list = parse([TRN, GPU])
    assert as_list == parse(json.dumps([TRN, GPU]))
    assert [g.name for g in as_list.compute_groups] == ["trn", "gpu"]
    gpu = as_list.compute_groups[1]
    assert (gpu.count, gpu.capacity, gpu.accelerator, gpu.devices_per_node, gpu.efa_interfaces) == (
        4,
        "spot",
        "cuda",
        8,
        32,
    )


def test_values_given_as_strings_are_coerced_and_defaults_fill_in():
    (group,) = parse(
        [{**TRN, "count": "0", "ebs_volume_gb": "100", "deep_health_checks": "InstanceStress"}]
    ).compute_groups
    assert group == ComputeGroup(
        name="trn",
        instance_type="ml.trn1.32xlarge",
        partition="trn1",
        count=0,
        ebs_volume_gb=100,
        deep_health_checks=("InstanceStress",),
    )


def test_only_needed_image_families():
    assert parse([TRN]).image_families == ("neuron",)
    assert parse([GPU]).image_families == ("cuda",)
    assert parse([GPU, TRN]).image_families == ("neuron", "cuda")
    assert parse([{"name": "cpu", "instance_type": "ml.c5.xlarge", "partition": "cpu"}]).image_families == ("cuda",)


# (groups, words the message must contain: where, which key, what is allowed)
BAD = [
    ([{**TRN, "instance_type": "ml.trn1.2xlarge"}], ["[0] (trn)", "'instance_type'", "ml.trn1.32xlarge"]),
    ([{**TRN, "instance_type": "ml.p3.2xlarge"}], ["'instance_type'", "stacks/accelerators.py"]),
    # HyperPod offers it, but its Grace hosts are arm64 and the CUDA image is amd64 only.
    ([{**GPU, "instance_type": "ml.p6e-gb200.36xlarge"}], ["[0] (gpu)", "'instance_type'", "arm64", "linux/amd64"]),
    ([TRN, {**GPU, "name": "trn"}], ["[1] (trn)", "'name'", "group [0] already has it"]),
    ([TRN, {**GPU, "partition": "trn1"}], ["[1] (gpu)", "'partition'", "group [0] already has it"]),
    ([{**GPU, "training_plan_arn": PLAN}], ["[0] (gpu)", "'capacity'", "on-demand when training_plan_arn"]),
    ([{**TRN, "training_plan_arn": "arn:aws:sagemaker:us-west-2:1:plan"}], ["'training_plan_arn'", "training-plan/"]),
    ([{**TRN, "count": 257}], ["'count'", "from 0 to 256"]),
    ([{**TRN, "count": -1}], ["'count'", "0 keeps the group"]),
    ([{**TRN, "count": "two"}], ["'count'", "an integer"]),
    ([{**TRN, "capacity": "reserved"}], ["'capacity'", "on-demand or spot"]),
    ([{**TRN, "threads_per_core": 3}], ["'threads_per_core'", "1 or 2"]),
    ([{**TRN, "ebs_volume_gb": 0}], ["'ebs_volume_gb'", "1 to 16384"]),
    ([{**TRN, "partition": "dev"}], ["'partition'", "not 'dev'"]),
    ([{**TRN, "partition": "trn_1"}], ["'partition'", "letters and digits"]),
    ([{**TRN, "name": "controller"}], ["'name'", "not controller or login"]),
    ([{**TRN, "deep_health_checks": ["Stress"]}], ["'deep_health_checks'", "InstanceStress, InstanceConnectivity"]),
    (
        [
            {
                "name": "cpu",
                "instance_type": "ml.c5.xlarge",
                "partition": "cpu",
                "deep_health_checks": ["InstanceStress"],
            }
        ],
        ["[0] (cpu)", "'deep_health_checks'", "GPU and Trainium instances only"],
    ),
    (
        [
            {
                "name": "gpu",
                "instance_type": "ml.g5.xlarge",
                "partition": "g5",
                "count": 1,
                "deep_health_checks": ["InstanceConnectivity"],
            }
        ],
        ["[0] (gpu)", "'deep_health_checks'", "no InstanceConnectivity on ml.g5.xlarge", "has no EFA"],
    ),
    (
        [{**TRN, "count": 1, "deep_health_checks": ["InstanceStress", "InstanceConnectivity"]}],
        ["[0] (trn)", "'deep_health_checks'", "no InstanceConnectivity with count 1", "at least 2"],
    ),
    ([{**TRN, "instance_typ": "x"}], ["[0] (trn)", "unknown key 'instance_typ'", "did you mean 'instance_type'"]),
    ([{"name": "trn", "instance_type": "ml.trn1.32xlarge"}], ["[0] (trn)", "lacks partition"]),
    (
        [{"name": "gpu", "instance_types": ["ml.g5.12xlarge", "ml.trn1.32xlarge"], "partition": "g5"}],
        ["[0] (gpu)", "'instance_types'", "one accelerator lane (one image per group)", "make two groups"],
    ),
    (
        [{"name": "gpu", "instance_types": ["ml.g5.12xlarge", "ml.g5.48xlarge"], "partition": "g5"}],
        ["[0] (gpu)", "'instance_types'", "as many devices per node", "ml.g5.48xlarge has 8"],
    ),
    (
        [{"name": "gpu", "instance_type": "ml.g5.24xlarge", "instance_types": ["ml.g5.12xlarge"], "partition": "g5"}],
        ["[0] (gpu)", "'instance_types'", "first type is instance_type (ml.g5.24xlarge)"],
    ),
    (
        [{"name": "gpu", "instance_types": ["ml.g5.12xlarge"] * 2, "partition": "g5"}],
        ["[0] (gpu)", "'instance_types'", "1 to 20 distinct types"],
    ),
    ([], ["'compute_groups'", "non-empty list"]),
    ("[{", ["'compute_groups'", "not valid JSON"]),
    (["trn"], ["[0]", "an object"]),
]


@pytest.mark.parametrize(("groups", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_groups_name_the_group_and_the_key(groups, words):
    with pytest.raises(StackConfigError) as caught:
        parse(groups)
    for word in words:
        assert word in str(caught.value)
    assert "compute_groups" in str(caught.value)


def test_a_training_plan_must_be_in_the_stack_region():
    east = PLAN.replace("us-west-2", "us-east-1")
    with pytest.raises(StackConfigError, match=r"\[0\] \(trn\), key 'training_plan_arn'.*stack's region us-west-2"):
        parse([{**TRN, "training_plan_arn": east}])
    assert parse([{**TRN, "training_plan_arn": PLAN}]).compute_groups[0].training_plan_arn == PLAN


def test_groups_built_in_code_are_checked_too():
    with pytest.raises(StackConfigError, match="'partition'"):
        HyperPodConfig(compute_groups=(ComputeGroup(name="a", instance_type="ml.g5.xlarge", partition="dev"),))
    with pytest.raises(StackConfigError, match="non-empty tuple of ComputeGroup"):
        HyperPodConfig(compute_groups=())


def test_the_connectivity_check_runs_on_two_or_more_nodes_with_efa():
    checks = ["InstanceStress", "InstanceConnectivity"]
    for count in (0, 2):
        (group,) = parse([{**TRN, "count": count, "deep_health_checks": checks}]).compute_groups
        assert group.deep_health_checks == tuple(checks) and group.efa_interfaces > 0


def test_every_cluster_is_continuous_unless_the_config_says_standard(synth, named_synths, synth_variant):
    for made in (synth, *named_synths.values()):
        _, cluster = made.one("AWS::SageMaker::Cluster")
        assert cluster["Properties"]["NodeProvisioningMode"] == "Continuous"
        assert cluster["Properties"]["Orchestrator"] == {"Slurm": {}}
    _, standard = synth_variant.one("AWS::SageMaker::Cluster")
    assert "NodeProvisioningMode" not in standard["Properties"]


def test_spot_and_a_minimum_need_continuous_provisioning():
    with pytest.raises(StackConfigError, match=r"group \[0\] \(trn\), key 'capacity'.*provisioning = standard"):
        HyperPodConfig.from_context({"provisioning": "standard", "compute_groups": [{**TRN, "capacity": "spot"}]})
    with pytest.raises(StackConfigError, match=r"key 'min_instance_count' has value 1; allowed: 0 with provisioning"):
        HyperPodConfig.from_context(
            {"provisioning": "standard", "compute_groups": [{**TRN, "count": 2, "min_instance_count": 1}]}
        )


def test_continuous_provisioning_takes_no_slurm_strategy_but_merge():
    refused = "'slurm_config_strategy' has value 'Managed'; allowed: Merge with provisioning"
    with pytest.raises(StackConfigError, match=refused):
        HyperPodConfig.from_context({"slurm_config_strategy": "Managed"})
    assert HyperPodConfig.from_context({"slurm_config_strategy": "Managed", "provisioning": "standard"})


def test_a_group_minimum_is_written_and_bounded_by_its_count(synthesize_from, source_root):
    with pytest.raises(StackConfigError, match=r"'min_instance_count' has value 3; allowed: an integer from 0 to .* 2"):
        parse([{**TRN, "count": 2, "min_instance_count": 3}])
    made = synthesize_from(source_root, compute_groups=[{**TRN, "count": 4, "min_instance_count": 2}])
    _, cluster = made.one("AWS::SageMaker::Cluster")
    compute = cluster["Properties"]["InstanceGroups"][-1]
    assert (compute["InstanceCount"], compute["MinInstanceCount"]) == (4, 2)
    assert all("MinInstanceCount" not in group for group in cluster["Properties"]["InstanceGroups"][:-1])


WEEKLY = "cron(0 3 ? * SUN *)"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"auto_patch": "DrainFirst"}, ["'auto_patch'", "WhenIdle, WhenAllIdle"]),  # API-only: not in the schema
        ({"auto_patch": "whenidle"}, ["'auto_patch'"]),
        ({"scheduled_update": "0 3 * * 0"}, ["'scheduled_update'", "cron(0 3 ? * SUN *)"]),
        ({"scheduled_update": "cron(0 25 ? * SUN *)"}, ["'scheduled_update'"]),  # hour 25
    ],
)
def test_ami_update_keys_take_what_cloudformation_accepts(changes, words):
    with pytest.raises(StackConfigError) as error:
        parse([{**TRN, **changes}])
    assert all(word in str(error.value) for word in ["[0] (trn)", *words]), str(error.value)


def test_ami_update_keys_reach_the_instance_group_rolling_one_node_at_a_time(synthesize_from, source_root):
    made = synthesize_from(
        source_root,
        compute_groups=[{**TRN, "auto_patch": "WhenIdle"}, {**GPU, "count": 2, "scheduled_update": WEEKLY}],
    )
    _, cluster = made.one("AWS::SageMaker::Cluster")
    *others, trn, gpu = cluster["Properties"]["InstanceGroups"]
    rolling = {
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
        "WaitIntervalInSeconds": 300,
    }
    assert trn["AutoPatchConfig"] == {"PatchingStrategy": "WhenIdle", "DeploymentConfig": rolling}
    assert "ScheduledUpdateConfig" not in trn and "AutoPatchConfig" not in gpu
    assert gpu["ScheduledUpdateConfig"] == {"ScheduleExpression": WEEKLY, "DeploymentConfig": rolling}
    assert all("AutoPatchConfig" not in g and "ScheduledUpdateConfig" not in g for g in others)
    errors = [
        m for m in lint_template(made.outdir / f"{made.config.stack_name}.template.json", ["us-west-2"]) if is_error(m)
    ]
    assert errors == []  # the properties as CloudFormation's schema has them (cfn-lint)


def test_a_flexible_group_names_its_types_in_priority_order_and_lints_clean(flexible_synth):
    """InstanceRequirements instead of InstanceType (CloudFormation's schema and CreateCluster's model name it so);
    the group's facts (image, devices) are its first type's."""
    _, cluster = flexible_synth.one("AWS::SageMaker::Cluster")
    compute = cluster["Properties"]["InstanceGroups"][-1]
    assert compute["InstanceRequirements"] == {"InstanceTypes": ["ml.g5.12xlarge", "ml.g5.24xlarge", "ml.g6e.12xlarge"]}
    assert "InstanceType" not in compute
    matches = lint_template(flexible_synth.outdir / f"{flexible_synth.stack.stack_name}.template.json", ["us-west-2"])
    assert [f"{m.rule.id} {m.message}" for m in matches if is_error(m)] == []
    report = json.loads((flexible_synth.outdir / "validation-report.json").read_text())
    nag = next(p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions")
    assert (nag["conclusion"], nag["violations"]) == ("success", [])


def test_a_flexible_groups_types_must_each_be_offered_in_the_region():
    with pytest.raises(StackConfigError, match=r"\[0\] \(gpu\).*'instance_types' has value 'ml.g6e.12xlarge'"):
        parse([{"name": "gpu", "instance_types": ["ml.g5.12xlarge", "ml.g6e.12xlarge"], "partition": "g5"}],
              region="ca-central-1", availability_zone_id="cac1-az1")  # fmt: skip
