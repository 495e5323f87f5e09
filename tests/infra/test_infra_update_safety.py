"""Every config key, changed on a deployed stack: the template diff decides in place / replaced / forbidden.

For each key the app is synthesized with one changed value and the diff against the default is
classified by stacks.update_safety from CloudFormation's create-only properties (cfn-lint's
schemas). The verdict must match the KEY_BEHAVIOUR table, which the README's "change after
deploy" column and `make deploy`'s check (stacks/predeploy.py) both use.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from stacks.build import REPO_ROOT
from stacks.compute_groups import GROUP_KEYS
from stacks.config import HyperPodConfig, StackConfigError
from stacks.update_safety import (
    FIXED,
    FORBIDDEN,
    KEY_BEHAVIOUR,
    NEW_STACK,
    REPLACED,
    classify,
    create_only_paths,
    fixed_names,
    verdict,
)

pytestmark = pytest.mark.xdist_group("infra")

BASE_GROUP = {"name": "compute", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 1}
# One changed value per key (with the base it needs, when the default would hide the change).
CHANGES: dict[str, tuple[dict, dict]] = {
    "stack_name": ({}, {"stack_name": "HyperPodSecond"}),
    "name_prefix": ({}, {"name_prefix": "other-prefix"}),
    "account": ({}, {"account": "210987654321"}),
    "region": ({}, {"region": "us-east-1", "availability_zone_id": "use1-az6"}),
    "availability_zone_id": ({}, {"availability_zone_id": "usw2-az1"}),
    "vpc_cidr": ({}, {"vpc_cidr": "10.1.0.0/16"}),
    "controller_instance_type": ({}, {"controller_instance_type": "ml.c5.2xlarge"}),
    "login_instance_type": ({"login_instance_count": 1}, {"login_instance_type": "ml.m5.2xlarge"}),
    "login_instance_count": ({}, {"login_instance_count": 1}),
    "fsx_storage_capacity_gib": ({}, {"fsx_storage_capacity_gib": 2400}),
    "fsx_throughput_mibps_per_tib": ({}, {"fsx_throughput_mibps_per_tib": 500}),
    "fsx_compression": ({}, {"fsx_compression": "NONE"}),
    "slurm_config_strategy": ({"provisioning": "standard"}, {"slurm_config_strategy": "Overwrite"}),
    "provisioning": ({}, {"provisioning": "standard"}),
    "node_recovery": ({}, {"node_recovery": "None"}),
    "runtime": ({}, {"runtime": "host"}),
    "retain_outputs": ({}, {"retain_outputs": True}),
    "lanes": ({}, {"lanes": "both"}),
    "observability": ({}, {"observability": "off"}),
    "teams": ({}, {"teams": json.dumps([{"name": "research", "gid": 3001, "fairshare": 3}])}),
    "users": (
        {"teams": json.dumps([{"name": "research", "gid": 3001}])},
        {"users": json.dumps([{"name": "alice", "uid": 3101, "team": "research"}])},
    ),
    "accounting_database": ({}, {"accounting_database": "external", "accounting_database_zone_id": "usw2-az1"}),
    "accounting_database_zone_id": (
        {"accounting_database": "external", "accounting_database_zone_id": "usw2-az1"},
        {"accounting_database_zone_id": "usw2-az2"},
    ),
    "alert_emails": ({}, {"alert_emails": "ops@example.com"}),
    "alert_stall_minutes": ({}, {"alert_stall_minutes": 5}),
}
GROUP_CHANGES = {
    "name": "worker",
    "instance_type": "ml.trn1n.32xlarge",
    "partition": "train",
    "count": 2,
    "min_instance_count": 1,
    "capacity": "spot",
    "training_plan_arn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/reserved",
    "ebs_volume_gb": 600,
    "threads_per_core": 2,
    "deep_health_checks": ["InstanceStress"],
    "scale_with_runs": True,  # InstanceCount becomes the floor: an in-place update
    "auto_patch": "WhenAllIdle",
    "scheduled_update": "cron(30 2 ? * SAT *)",
    "instance_types": ["ml.trn1.32xlarge", "ml.trn1n.32xlarge"],  # InstanceType becomes InstanceRequirements
}


@pytest.fixture(scope="module")
def synth_with(synthesize_from, source_root):
    cache: dict[str, dict] = {}

    def run(**overrides) -> tuple[HyperPodConfig, dict]:
        key = json.dumps(overrides, sort_keys=True)
        if key not in cache:
            synth = synthesize_from(source_root, **overrides)
            cache[key] = (synth.config, synth.template)
        return cache[key]

    return run


def key_verdict(synth_with, base: dict, change: dict) -> tuple[str, list[str]]:
    before_config, before = synth_with(**base)
    after_config, after = synth_with(**{**base, **change})
    identity = (before_config.stack_name, before_config.account, before_config.region)
    if identity != (after_config.stack_name, after_config.account, after_config.region):
        # Another stack, not an update: it fails if a name it creates is already taken.
        global_names = {n for n in fixed_names(after) if n.startswith("AWS::S3::Bucket ")}
        same_place = identity[1:] == (after_config.account, after_config.region)
        taken = fixed_names(before) & (fixed_names(after) if same_place else global_names)
        return (FORBIDDEN if taken else NEW_STACK), sorted(taken)
    changes = classify(before, after)
    return verdict(changes), [change.line() for change in changes if change.action in (REPLACED, FORBIDDEN)]


def test_every_key_has_a_change_and_a_documented_behaviour():
    keys = set(HyperPodConfig.keys())
    assert set(KEY_BEHAVIOUR) == keys, "add the new key to stacks/update_safety.KEY_BEHAVIOUR"
    tested = set(CHANGES) | {"compute_groups"} | {k for k, b in KEY_BEHAVIOUR.items() if b.verdict == FIXED}
    assert tested == keys, "add a changed value for the new key to CHANGES"
    assert set(GROUP_CHANGES) == set(GROUP_KEYS), "add a changed value for the new group key"


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_changing_a_key_on_a_live_stack(synth_with, key):
    base, change = CHANGES[key]
    found, why = key_verdict(synth_with, base, change)
    assert found == KEY_BEHAVIOUR[key].verdict, "\n".join([f"{key}: {found}, table says {KEY_BEHAVIOUR[key]}", *why])


def test_every_compute_group_key_and_a_new_group(synth_with):
    expected = KEY_BEHAVIOUR["compute_groups"].verdict
    base = {"compute_groups": json.dumps([BASE_GROUP])}
    for group_key, value in GROUP_CHANGES.items():
        found, why = key_verdict(synth_with, base, {"compute_groups": json.dumps([{**BASE_GROUP, group_key: value}])})
        assert found == expected, "\n".join([f"compute_groups[].{group_key}: {found}", *why])
    second = {"name": "gpu", "instance_type": "ml.g5.12xlarge", "partition": "g5"}
    found, why = key_verdict(synth_with, base, {"compute_groups": json.dumps([BASE_GROUP, second])})
    assert found == expected, "\n".join(["adding a group", *why])


def test_fixed_keys_take_no_other_value():
    for key, behaviour in KEY_BEHAVIOUR.items():
        if behaviour.verdict == FIXED:
            default = next(f.default for f in dataclasses.fields(HyperPodConfig) if f.name == key)
            with pytest.raises(StackConfigError, match=f"'{key}'"):
                HyperPodConfig.from_context({key: default + 1}, environ={})


def test_the_forbidden_cases_of_the_issue_are_found(synth_with):
    """name_prefix: the data links on the same paths; vpc_cidr / zone: the fixed-name cluster."""
    _, why = key_verdict(synth_with, *CHANGES["name_prefix"])
    assert sum("AWS::FSx::DataRepositoryAssociation): forbidden" in line for line in why) == 3
    for key in ("vpc_cidr", "availability_zone_id"):
        _, why = key_verdict(synth_with, *CHANGES[key])
        assert any("AWS::SageMaker::Cluster): forbidden" in line and "ClusterName=" in line for line in why), key
        assert any("AWS::FSx::FileSystem): replaced" in line for line in why), key


def test_create_only_lists_come_from_the_installed_schemas():
    assert ("ClusterName",) in create_only_paths("AWS::SageMaker::Cluster")
    assert ("VpcConfig",) in create_only_paths("AWS::SageMaker::Cluster")
    assert ("BucketName",) in create_only_paths("AWS::S3::Bucket")
    assert create_only_paths("Custom::CDKBucketDeployment") == []


def test_readme_change_after_deploy_column_matches_the_table():
    readme = (REPO_ROOT / "docs" / "configuration.md").read_text()
    header = re.search(r"^\| key \| default \| allowed \| change after deploy \|$", readme, re.M)
    assert header, "docs/configuration.md's config table needs a 'change after deploy' column"
    for key, behaviour in KEY_BEHAVIOUR.items():
        row = re.search(rf"^\| `{key}` \|.*\| ([^|]*) \|$", readme, re.M)
        assert row, f"no docs/configuration.md row for {key}"
        assert row.group(1).strip() == behaviour.readme(), f"{key}: docs/configuration.md says {row.group(1)!r}"
