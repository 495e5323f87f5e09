"""Finding the deployment: stack outputs, cluster facts, and the errors a user meets on the way."""

import boto3
import pytest
from botocore.exceptions import ClientError

from cluster_contract import CLUSTER_FACTS_KEY
from hpctl.common.errors import client_error_message
from hpctl.common.facts import read_cluster_facts
from hpctl.common.stack import describe_stack, require_outputs


def test_outputs_of_the_deployed_stack(deployed):
    stack = require_outputs(describe_stack(boto3.Session(region_name=deployed.region), deployed.stack))
    assert stack.status == "CREATE_COMPLETE"
    assert stack.output("ClusterArn") == deployed.cluster_arn
    assert stack.output("ControllerGroup") == "controller"
    assert stack.output("BucketName") == deployed.bucket


def test_no_credentials(deployed, hpctl, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, out, err = hpctl("status")
    assert code == 2 and out == ""
    assert (
        err == "error: no AWS credentials found: run `aws configure` (or `aws sso login`), "
        "or set AWS_PROFILE / AWS_ACCESS_KEY_ID\n"
    )


def test_unknown_profile(deployed, hpctl):
    code, _, err = hpctl("status", "--profile", "nosuchprofile")
    assert code == 2
    assert err.startswith("error: The config profile (nosuchprofile) could not be found: check --profile")


def test_wrong_region_names_the_region_looked_in(deployed, hpctl):
    code, _, err = hpctl("status", "--region", "us-east-1")
    assert code == 2
    assert err == (
        f"error: stack {deployed.stack} not found in region us-east-1: deploy it (`make deploy`), "
        "or pass the region it lives in (--region) and its name (--stack)\n"
    )


def test_stack_not_deployed(deployed, hpctl):
    code, _, err = hpctl("status", "--stack", "NeverDeployed")
    assert code == 2
    assert err.startswith("error: stack NeverDeployed not found in region us-west-2: deploy it")


def test_no_region_anywhere(aws_env, tmp_path, monkeypatch, hpctl):
    monkeypatch.chdir(tmp_path)  # no cdk.json, no AWS_REGION, no profile
    monkeypatch.setattr("hpctl.common.project.PACKAGE_CHECKOUT", tmp_path)  # nor a checkout hpctl is installed from
    code, _, err = hpctl("status")
    assert code == 2
    assert err == "error: no AWS region: pass --region, set `region` in cdk.json context, or set AWS_REGION\n"


def test_failed_deploy(deployed, hpctl):
    deployed.set_stack_status("ROLLBACK_COMPLETE")
    code, _, err = hpctl("status")
    assert code == 2
    assert err.startswith(
        f"error: stack {deployed.stack} is ROLLBACK_COMPLETE: its deploy failed; see the CloudFormation events"
    )


def test_stack_still_creating_has_no_outputs(bare_stack, hpctl):
    bare_stack.create({}, status="CREATE_IN_PROGRESS")
    code, _, err = hpctl("status")
    assert code == 2
    assert err == (
        "error: stack HplTestStack is CREATE_IN_PROGRESS and has no outputs yet: "
        "`hpctl wait` follows the deploy until the cluster is in service\n"
    )


def test_a_stack_without_the_contract_outputs(bare_stack, hpctl):
    bare_stack.create({"ClusterName": "c"})
    code, _, err = hpctl("status")
    assert code == 2
    assert "lacks the outputs BucketName, ControllerGroup: is it this project's stack?" in err


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("ExpiredToken", "AWS credentials have expired (ExpiredToken): refresh them (e.g. `aws sso login`) and retry"),
        (
            "InvalidClientTokenId",
            "AWS rejected the credentials (InvalidClientTokenId): check AWS_PROFILE or run `aws configure`",
        ),
        ("AccessDenied", "not allowed to read stack S: User arn:aws:iam::1:user/u is not authorized"),
        ("Throttling", "read stack S failed: Throttling: User arn:aws:iam::1:user/u is not authorized"),
    ],
)
def test_service_refusals_read_as_one_line(code, expected):
    error = ClientError(
        {"Error": {"Code": code, "Message": "User arn:aws:iam::1:user/u is not authorized"}}, "DescribeStacks"
    )
    assert client_error_message(error, doing="read stack S") == expected


def test_cluster_facts_come_from_the_lifecycle_prefix(deployed):
    session = boto3.Session(region_name=deployed.region)
    facts = read_cluster_facts(session, deployed.bucket)
    assert facts["payloads_dir"] == "/fsx/payloads" and facts["cluster_name"] == deployed.cluster


def test_missing_facts_fall_back_to_the_contract_defaults(deployed, capsys):
    session = boto3.Session(region_name=deployed.region)
    session.client("s3").delete_object(Bucket=deployed.bucket, Key=CLUSTER_FACTS_KEY)
    facts = read_cluster_facts(session, deployed.bucket)
    assert (facts["payloads_dir"], facts["default_user"]) == ("/fsx/payloads", "ubuntu")
    assert "cluster-facts.json not found; using the default node paths" in capsys.readouterr().err
