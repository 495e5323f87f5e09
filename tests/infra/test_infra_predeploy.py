"""`make deploy`'s first step, against a deployed stack played by moto: refused keys are named up front."""

from __future__ import annotations

import json
import os

import boto3
import pytest
from moto import mock_aws

from stacks.config import HyperPodConfig
from stacks.predeploy import check as predeploy_check
from stacks.predeploy import context_from, main, template_refusals
from stacks.update_safety import CONFIG_METADATA_KEY, config_record

pytestmark = pytest.mark.xdist_group("infra")
REGION = "us-west-2"


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """Fake credentials only (no profile, config file or metadata service), and moto behind them."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "CDK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with mock_aws():
        yield boto3.Session(region_name=REGION)


def deploy(session: boto3.Session, context: dict) -> HyperPodConfig:
    """What a deploy of ``context`` leaves: the stack, its template recording the config, the bucket."""
    config = HyperPodConfig.from_context(context, environ={"CDK_DEFAULT_ACCOUNT": "123456789012"})
    template = {
        "Metadata": {CONFIG_METADATA_KEY: config_record(config)},
        "Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
    }
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


def test_in_place_changes_pass(aws):
    deploy(aws, context_from([]))
    groups = '[{"name": "compute", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 4}]'
    context = context_from(["-c", "fsx_compression=NONE", "--context", f"compute_groups={groups}"])
    assert predeploy_check(context, aws) == []


def test_a_bucket_kept_by_retain_outputs_blocks_the_next_create_and_says_how(aws):
    config = deploy(aws, context_from(["-c", "retain_outputs=true"]))
    aws.client("cloudformation").delete_stack(StackName=config.stack_name)  # `make destroy`: the bucket stays
    (problem,) = predeploy_check(context_from([]), aws)
    assert problem.startswith(f"bucket {config.bucket_name} already exists but stack {config.stack_name} does not")
    assert f"aws s3 rb s3://{config.bucket_name} --force" in problem and "name_prefix" in problem


def test_the_command_exits_2_with_the_errors(aws, capsys):
    deploy(aws, context_from([]))
    assert main(["-c", "name_prefix=other-prefix"]) == 2
    assert "error: config key 'name_prefix'" in capsys.readouterr().err
    assert main([]) == 0


def test_without_credentials_the_deploy_goes_on(monkeypatch, tmp_path, capsys):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main([]) == 0
    assert "no AWS credentials" in capsys.readouterr().err


def test_a_stack_without_recorded_config_is_compared_resource_by_resource(synth):
    deployed = {key: value for key, value in synth.template.items() if key != "Metadata"}
    context = {**context_from([]), "account": synth.config.account, "vpc_cidr": "10.1.0.0/16"}
    refusals = template_refusals(deployed, context, environ={})
    assert any("HyperPodCluster" in line and "ClusterName=" in line for line in refusals), refusals
    assert template_refusals(deployed, {**context, "vpc_cidr": synth.config.vpc_cidr}, environ={}) == []
