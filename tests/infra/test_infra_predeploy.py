"""`make deploy`'s first step, against a deployed stack played by moto: refused keys are named up front."""

from __future__ import annotations

import copy
import json

import boto3
import pytest
from moto import mock_aws

from stacks.config import HyperPodConfig, StackConfigError
from stacks.predeploy import (
    DELETE_FACT_KEY,
    context_from,
    delete_lowers_target,
    main,
    parse_arguments,
    template_refusals,
)
from stacks.predeploy import check as predeploy_check
from stacks.update_safety import CONFIG_METADATA_KEY, FSX_ONLY_FOLDERS, Allowances, config_record, value_refusals

pytestmark = pytest.mark.xdist_group("infra")
REGION = "us-west-2"


@pytest.fixture
def aws(no_aws_credentials):
    """Fake credentials only (no profile, config file or metadata service), and moto behind them."""
    no_aws_credentials.setenv("AWS_ACCESS_KEY_ID", "testing")
    no_aws_credentials.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield boto3.Session(region_name=REGION)


PLACEHOLDER_RESOURCES = {"Placeholder": {"Type": "AWS::SNS::Topic"}}


def deploy(session: boto3.Session, context: dict) -> HyperPodConfig:
    """What a deploy of ``context`` leaves: the stack, its template recording the config, the bucket.
    moto cannot create the app's own resources, so the template holds the config and a placeholder."""
    config = HyperPodConfig.from_context(context, environ={"CDK_DEFAULT_ACCOUNT": "123456789012"})
    template = {"Metadata": {CONFIG_METADATA_KEY: config_record(config)}, "Resources": PLACEHOLDER_RESOURCES}
    session.client("cloudformation").create_stack(StackName=config.stack_name, TemplateBody=json.dumps(template))
    session.client("s3").create_bucket(
        Bucket=config.bucket_name, CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    return config


def test_first_deploy_has_nothing_in_its_way(aws):
    assert predeploy_check(context_from([]), aws) == []


def test_a_forbidden_change_is_refused_naming_the_key(aws):
    deploy(aws, context_from([]))
    problems = predeploy_check(context_from(["-c", "vpc_cidr=10.1.0.0/16", "--no-rollback"]), aws)
    assert len(problems) == 1
    assert problems[0].startswith(
        "config key 'vpc_cidr' is '10.0.0.0/16' on the deployed stack and '10.1.0.0/16' now: it cannot change"
    )
    assert "make destroy" in problems[0]


GROUPS = '[{"name": "compute", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 4}]'


def test_in_place_changes_pass(aws):
    """The config rules let these through; the resource comparison sees an unchanged template (the
    placeholder), so only the config is judged here (the tests below compare real templates)."""
    deploy(aws, context_from([]))
    context = context_from(["-c", "fsx_compression=NONE", "--context", f"compute_groups={GROUPS}"])
    assert predeploy_check(context, aws, wanted_template={"Resources": PLACEHOLDER_RESOURCES}) == []
    grown = context_from(["-c", "fsx_storage_capacity_gib=4800"])
    assert predeploy_check(grown, aws, wanted_template={"Resources": PLACEHOLDER_RESOURCES}) == []


def test_shrinking_fsx_is_refused_naming_the_key(aws):
    deploy(aws, context_from(["-c", "fsx_storage_capacity_gib=4800"]))
    (problem,) = predeploy_check(context_from(["-c", "fsx_storage_capacity_gib=2400"]), aws)
    assert problem.startswith(
        "config key 'fsx_storage_capacity_gib' is 4800 on the deployed stack and 2400 now: FSx for Lustre storage "
        "can only grow"
    )
    assert "set it back to 4800 or larger" in problem


def test_on_demand_to_spot_is_refused_naming_the_group_and_key(aws):
    deploy(aws, context_from(["--context", f"compute_groups={GROUPS}"]))
    spot = GROUPS.replace('"count": 4', '"count": 4, "capacity": "spot"')
    (problem,) = predeploy_check(context_from(["--context", f"compute_groups={spot}"]), aws)
    assert problem.startswith(
        "config key 'compute_groups' group 'compute', key 'capacity' is 'on-demand' on the deployed stack and "
        "'spot' now: a HyperPod instance group's capacity type is fixed when it is created"
    )


def test_switching_a_live_cluster_to_continuous_is_refused_with_the_reason(aws):
    standard = ["-c", "provisioning=standard", "-c", "slurm_config_strategy=Managed"]
    deploy(aws, context_from([*standard, "--context", f"compute_groups={GROUPS}"]))
    (problem,) = predeploy_check(context_from(["--context", f"compute_groups={GROUPS}"]), aws)
    assert problem.startswith("config key 'provisioning' is 'standard' on the deployed stack and 'continuous' now")
    assert "set provisioning back to 'standard' (and slurm_config_strategy to 'Managed', as deployed)" in problem


def test_a_stack_recorded_before_the_provisioning_key_reads_as_its_mode():
    """Before the key, a cluster was continuous exactly when a group was Spot."""
    spot = [{"name": "gpu", "instance_type": "ml.p5.48xlarge", "partition": "p5", "capacity": "spot"}]
    old_spot = {"lanes": "cluster", "compute_groups": spot}
    old_on_demand = {"lanes": "cluster", "compute_groups": [{**spot[0], "capacity": "on-demand"}]}
    now = config_record(HyperPodConfig.from_context({"compute_groups": spot}, environ={}))
    assert value_refusals(old_spot, now, Allowances()) == []
    (problem,) = value_refusals(old_on_demand, {**now, "compute_groups": old_on_demand["compute_groups"]}, Allowances())
    assert "config key 'provisioning' is 'standard' on the deployed stack" in problem


def test_dropping_the_cluster_lane_is_refused_saying_what_data_goes(aws):
    deploy(aws, context_from([]))
    (problem,) = predeploy_check(context_from(["-c", "lanes=jobs"]), aws)
    assert problem.startswith("config key 'lanes' is 'cluster' on the deployed stack and 'jobs' now: that deletes")
    assert all(folder in problem for folder in FSX_ONLY_FOLDERS) and "--allow-drop-cluster-lane" in problem


def test_the_flags_let_a_dropped_lane_or_a_removed_group_through():
    groups = [*json.loads(GROUPS), {"name": "gpu", "instance_type": "ml.g5.xlarge", "partition": "g5"}]
    before = config_record(HyperPodConfig.from_context({"compute_groups": groups}, environ={}))
    renamed = config_record(
        HyperPodConfig.from_context({"compute_groups": [groups[0], {**groups[1], "name": "gpu2"}]}, environ={})
    )
    (problem,) = value_refusals(before, renamed, Allowances())
    assert problem.startswith("config key 'compute_groups': group 'gpu' (partition 'g5', 1 x ml.g5.xlarge) is gone")
    assert "--allow-remove-group gpu" in problem
    assert value_refusals(before, renamed, Allowances(remove_groups=("gpu",))) == []
    jobs_only = {**before, "lanes": "jobs"}
    assert value_refusals(before, jobs_only, Allowances()) != []
    assert value_refusals(before, jobs_only, Allowances(drop_cluster_lane=True)) == []
    assert value_refusals(jobs_only, {**jobs_only, "compute_groups": []}, Allowances()) == []  # no cluster to lose


def test_help_prints_the_flags_and_touches_nothing(capsys):
    """`--help` answers (the laptop-side check runs it in a fresh venv) instead of starting a predeploy."""
    with pytest.raises(SystemExit) as done:
        parse_arguments(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m stacks.predeploy") and "--allow-drop-cluster-lane" in out


def test_flags_are_read_beside_the_deploy_arguments():
    context, allow, online = parse_arguments(
        ["-c", "lanes=jobs", "--allow-replace", "FsxFileSystem1", "--no-rollback", "--allow-drop-cluster-lane"]
    )
    assert context["lanes"] == "jobs" and online
    assert allow == Allowances(replace=("FsxFileSystem1",), drop_cluster_lane=True)
    assert parse_arguments(["--skip-online-checks"])[2] is False


def stack_session(stubbed_session, template: dict, stack_name: str):
    """CloudFormation answering with ``template`` for the deployed stack (moto cannot create the app's own)."""
    session = stubbed_session()
    stubber = session.stub("cloudformation")
    stack = {"StackName": stack_name, "StackStatus": "UPDATE_COMPLETE", "CreationTime": "2026-01-01T00:00:00Z"}
    stubber.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": stack_name})
    stubber.add_response("get_template", {"TemplateBody": json.dumps(template)}, {"StackName": stack_name})
    return session


def released(synth, edit) -> dict:
    """The deployed template as an earlier release made it: the current one with ``edit`` applied."""
    template = copy.deepcopy(synth.template)
    edit(template["Resources"])
    return template


def test_a_template_replacement_of_fsx_is_refused_naming_the_resource(synth, stubbed_session):
    fsx_id, _ = synth.one("AWS::FSx::FileSystem")

    def older_lustre(resources):  # a release that encrypted FSx with its own key: create-only, so FSx is replaced
        resources[fsx_id]["Properties"]["KmsKeyId"] = "alias/hyperpod-fsx"

    context = {**context_from([]), "account": synth.config.account}
    session = stack_session(stubbed_session, released(synth, older_lustre), synth.config.stack_name)
    (problem,) = predeploy_check(context, session, wanted_template=synth.template)
    assert problem.startswith(
        f"resource {fsx_id} (AWS::FSx::FileSystem) would be replaced (create-only KmsKeyId changes), "
        "losing everything only on FSx"
    )
    assert f"--allow-replace {fsx_id}" in problem
    allowed = Allowances(replace=(fsx_id,))
    session = stack_session(stubbed_session, released(synth, older_lustre), synth.config.stack_name)
    assert predeploy_check(context, session, allow=allowed, wanted_template=synth.template) == []


def test_a_renamed_logical_id_of_fsx_is_refused_as_a_removal(synth):
    fsx_id, _ = synth.one("AWS::FSx::FileSystem")

    def old_name(resources):
        resources["SharedFileSystemOld"] = resources.pop(fsx_id)

    refusals = template_refusals(released(synth, old_name), synth.template)
    assert any(
        line.startswith("resource SharedFileSystemOld (AWS::FSx::FileSystem) would be removed") for line in refusals
    )


def test_the_zone_of_a_release_that_took_zone_names_must_keep_its_id(aws):
    """Upgrading from the release with availability_zone (a name): predeploy names the ID to set."""
    zones = aws.client("ec2").describe_availability_zones()["AvailabilityZones"]
    other = next(zone for zone in zones if zone["ZoneId"] != "usw2-az4")
    config = deploy(aws, context_from([]))
    record = {key: value for key, value in config_record(config).items() if key != "availability_zone_id"}
    template = {"Metadata": {CONFIG_METADATA_KEY: {**record, "availability_zone": other["ZoneName"]}}}
    cloudformation = aws.client("cloudformation")
    cloudformation.update_stack(
        StackName=config.stack_name, TemplateBody=json.dumps({**template, "Resources": PLACEHOLDER_RESOURCES})
    )
    (problem,) = predeploy_check(context_from([]), aws)
    assert problem.startswith("upgrade note: the deployed stack was made by a release that took a zone name")
    assert f"availability_zone_id to {other['ZoneId']!r}" in problem


def test_a_bucket_kept_by_retain_outputs_blocks_the_next_create_and_says_how(aws):
    config = deploy(aws, context_from(["-c", "retain_outputs=true"]))
    aws.client("cloudformation").delete_stack(StackName=config.stack_name)  # `make destroy`: the bucket stays
    (problem,) = predeploy_check(context_from([]), aws)
    assert problem.startswith(f"bucket {config.bucket_name} already exists but stack {config.stack_name} does not")
    assert f"aws s3 rb s3://{config.bucket_name} --force" in problem and "name_prefix" in problem


def test_the_command_exits_2_with_the_errors(aws, capsys):
    deploy(aws, context_from([]))
    assert main(["-c", "name_prefix=other-prefix", "--skip-online-checks"]) == 2
    assert "error: config key 'name_prefix'" in capsys.readouterr().err
    assert main(["--skip-online-checks"]) == 0  # moto has no Service Quotas: test_infra_online_checks.py stubs it


def test_without_credentials_the_deploy_goes_on(no_aws_credentials, capsys):
    assert main([]) == 0
    err = capsys.readouterr().err
    assert "no AWS credentials" in err
    assert "online checks (zone ID, zone offerings, training plans, service quotas) were skipped" in err


def test_a_stack_without_recorded_config_is_compared_resource_by_resource(synth, stubbed_session):
    vpc_id, _ = synth.one("AWS::EC2::VPC")

    def other_cidr(resources):
        resources[vpc_id]["Properties"]["CidrBlock"] = "10.1.0.0/16"

    deployed = {key: value for key, value in released(synth, other_cidr).items() if key != "Metadata"}
    context = {**context_from([]), "account": synth.config.account}
    refusals = predeploy_check(
        context, stack_session(stubbed_session, deployed, synth.config.stack_name), wanted_template=synth.template
    )
    assert any("HyperPodCluster" in line and "ClusterName=" in line for line in refusals), refusals
    assert any(line.startswith(f"resource {vpc_id} (AWS::EC2::VPC) would be replaced") for line in refusals)
    assert template_refusals(synth.template, synth.template) == []


def test_a_controller_type_change_is_refused_unless_allowed():
    before = config_record(HyperPodConfig.from_context({}, environ={}))
    after = config_record(HyperPodConfig.from_context({"controller_instance_type": "ml.c5.2xlarge"}, environ={}))
    (problem,) = value_refusals(before, after, Allowances())
    assert problem.startswith(
        "config key 'controller_instance_type' is 'ml.c5.xlarge' on the deployed stack and 'ml.c5.2xlarge' now: "
        "HyperPod replaces the controller node"
    )
    assert "--allow-controller-replace" in problem
    assert value_refusals(before, after, Allowances(replace_controller=True)) == []
    _, allow, _ = parse_arguments(["--allow-controller-replace"])
    assert allow.replace_controller


SCALED = json.dumps(
    [
        {
            "name": "compute",
            "instance_type": "ml.trn1.32xlarge",
            "partition": "trn1",
            "count": 4,
            "min_instance_count": 1,
            "scale_with_runs": True,
        }
    ]
)


def moto_cluster(session: boto3.Session, config: HyperPodConfig) -> None:
    """The deployed cluster as the template made it: the scaled group at its floor (InstanceCount)."""
    group = config.compute_groups[0]
    session.client("sagemaker").create_cluster(
        ClusterName=config.cluster_name,
        InstanceGroups=[
            {
                "InstanceGroupName": group.name,
                "InstanceType": group.instance_type,
                "InstanceCount": group.deployed_count,
                "LifeCycleConfig": {"SourceS3Uri": config.lifecycle_s3_uri, "OnCreate": "on_init_complete.sh"},
                "ExecutionRole": "arn:aws:iam::123456789012:role/node",
                "ThreadsPerCore": group.threads_per_core,
            }
        ],
    )


def set_target_count(config: HyperPodConfig, count: int) -> None:
    """What BatchAddClusterNodes and BatchDeleteClusterNodes do to the group's target (moto has neither call)."""
    from moto.sagemaker.models import sagemaker_backends

    (cluster,) = sagemaker_backends["123456789012"][REGION].clusters.values()
    cluster.instance_groups[0]["TargetCount"] = count


def test_a_group_scaled_with_runs_shows_no_drift_after_scaling_up_and_down(aws):
    """The template keeps the floor; a deploy is refused only while chains hold nodes above it."""
    context = context_from(["-c", f"compute_groups={SCALED}"])
    config = deploy(aws, context)
    assert config.compute_groups[0].deployed_count == 1  # the template's InstanceCount: the floor, not count 4
    moto_cluster(aws, config)
    unchanged = {"wanted_template": {"Resources": PLACEHOLDER_RESOURCES}}
    assert predeploy_check(context, aws, **unchanged) == []
    set_target_count(config, 3)  # two chains claimed two nodes
    (problem,) = predeploy_check(context, aws, **unchanged)
    assert "group 'compute' scales with runs and holds 3 nodes, above its floor 1" in problem
    set_target_count(config, 1)  # their release jobs gave them back
    assert predeploy_check(context, aws, **unchanged) == []


def set_current_count(config: HyperPodConfig, count: int) -> None:
    from moto.sagemaker.models import sagemaker_backends

    (cluster,) = sagemaker_backends["123456789012"][REGION].clusters.values()
    cluster.instance_groups[0]["CurrentCount"] = count


@pytest.mark.parametrize("fact", [None, "true", "false"])
def test_the_recorded_answer_on_batch_delete_picks_the_count_that_shows_claims(aws, fact):
    """The open question of docs/deploy.md, both answers and none: after the releases the target stays at 3 (the
    deletes did not lower it) while 1 node runs. Only the recorded answer 'false' reads that as no claim."""
    recorded = [] if fact is None else ["-c", f"{DELETE_FACT_KEY}={fact}"]
    context = context_from(["-c", f"compute_groups={SCALED}", *recorded])
    config = deploy(aws, context)
    moto_cluster(aws, config)
    unchanged = {"wanted_template": {"Resources": PLACEHOLDER_RESOURCES}}
    set_target_count(config, 3)
    set_current_count(config, 1)
    problems = predeploy_check(context, aws, **unchanged)
    if fact == "false":
        assert problems == []
        set_current_count(config, 2)  # a chain holds a node: the running count shows it
        (problem,) = predeploy_check(context, aws, **unchanged)
        assert "holds 2 nodes, above its floor 1" in problem and DELETE_FACT_KEY not in problem
    else:
        (problem,) = problems
        assert "holds 3 nodes, above its floor 1" in problem
        assert (DELETE_FACT_KEY in problem) == (fact is None)


def test_a_recorded_answer_that_is_not_true_or_false_is_refused_naming_the_key():
    with pytest.raises(StackConfigError, match=f"context key '{DELETE_FACT_KEY}' has value 'maybe'"):
        delete_lowers_target({DELETE_FACT_KEY: "maybe"})
    assert delete_lowers_target({}) is None and delete_lowers_target({DELETE_FACT_KEY: "True"}) is True


def test_leaving_prometheus_is_refused_naming_the_metrics_lost_unless_allowed(aws):
    deploy(aws, context_from([]))  # observability = prometheus, the default
    placeholder = {"Resources": PLACEHOLDER_RESOURCES}
    (problem,) = predeploy_check(context_from(["-c", "observability=off"]), aws, wanted_template=placeholder)
    assert problem.startswith("config key 'observability' is 'prometheus' on the deployed stack and 'off' now")
    assert "Amazon Managed Prometheus workspace and every sample in it" in problem and "loss" in problem
    assert "--allow-drop-metrics" in problem
    allowed = Allowances(drop_metrics=True)
    context = context_from(["-c", "observability=off"])
    assert predeploy_check(context, aws, allow=allowed, wanted_template=placeholder) == []
    assert parse_arguments(["--allow-drop-metrics"])[1] == allowed


def test_a_removed_metrics_workspace_is_refused_by_the_template_comparison_too():
    """A release that renames the workspace's logical id deletes it as surely as the config switch."""
    workspace = {"Type": "AWS::APS::Workspace", "Properties": {"Alias": "hpl-metrics"}}
    deployed, wanted = {"Resources": {"MetricsWorkspace": workspace}}, {"Resources": {"Metrics2Workspace": workspace}}
    (problem,) = template_refusals(deployed, wanted)
    assert problem.startswith("resource MetricsWorkspace (AWS::APS::Workspace) would be removed")
    assert "every sample in it" in problem
    assert template_refusals(deployed, wanted, Allowances(drop_metrics=True)) == []
