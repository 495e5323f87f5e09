"""hpctl doctor: AWS answered by botocore Stubbers (moto has no Service Quotas), the local tools as real
programs on a PATH of their own (tiny scripts), the OK line and each FAIL line with its fix."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from cluster_contract import node_verdict
from hpctl.cli import main
from hpctl.cluster import doctor

REGION = "us-west-2"
ZONE = "usw2-az4"
TRN = {"name": "trn", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 2}
CONTEXT = {"region": REGION, "availability_zone_id": ZONE, "compute_groups": json.dumps([TRN])}
TOKEN = "hf_secret_value_never_printed"
SERVICES = ("sts", "service-quotas", "ec2", "cloudformation", "secretsmanager")
ROLE_ARN = "arn:aws:iam::123456789012:user/dev"


@pytest.fixture
def aws(monkeypatch):
    """A session whose clients answer from Stubbers; a call nobody stubbed fails the test."""
    session = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    clients = {name: session.client(name) for name in SERVICES}
    stubbers = {name: Stubber(client) for name, client in clients.items()}
    for stubber in stubbers.values():
        stubber.activate()
    monkeypatch.setattr(session, "client", lambda name, **_: clients[name])
    yield session, stubbers
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()


def tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def environ(tmp_path):
    """PATH holds only working docker and node programs; HF_TOKEN is set; no token file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "docker", '[ "$1" = info ] && echo "Server Version: 27.0.0"')
    tool(bin_dir, "node", '[ "$1" = --version ] && echo v22.11.0')
    return {"PATH": str(bin_dir), "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf")}


def quota_page(**values: float) -> dict:
    return {
        "Quotas": [
            {"ServiceCode": "sagemaker", "QuotaName": f"{name} for cluster usage", "QuotaCode": "L-1", "Value": value}
            for name, value in values.items()
        ]
    }


def answer(stubbers, *, quotas=None, quota_error=None, offerings=None, toolkit=None, toolkit_error=None) -> None:
    """The account's answers, in the order doctor asks; an error code replaces that call's answer."""
    stubbers["sts"].add_response("get_caller_identity", {"Account": "123456789012", "Arn": ROLE_ARN, "UserId": "AID"})
    if quota_error:
        stubbers["service-quotas"].add_client_error("list_service_quotas", *quota_error)
    else:
        stubbers["service-quotas"].add_response(
            "list_service_quotas",
            quota_page(**(quotas or {"ml.trn1.32xlarge": 4, "ml.c5.xlarge": 2})),
            {"ServiceCode": "sagemaker"},
        )
    found = offerings or {"c5.xlarge": [ZONE, "usw2-az1"], "trn1.32xlarge": [ZONE]}
    stubbers["ec2"].add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {"InstanceType": name, "LocationType": "availability-zone-id", "Location": zone}
                for name, zones in found.items()
                for zone in zones
            ]
        },
        {
            "LocationType": "availability-zone-id",
            "Filters": [{"Name": "instance-type", "Values": ["c5.xlarge", "trn1.32xlarge"]}],
        },
    )
    if toolkit_error:
        stubbers["cloudformation"].add_client_error("describe_stacks", *toolkit_error)
        return
    if toolkit is None:
        toolkit = {"Outputs": [{"OutputKey": "BootstrapVersion", "OutputValue": "28"}]}
    stack = {"StackName": "CDKToolkit", "CreationTime": "2024-01-01", "StackStatus": "CREATE_COMPLETE", **toolkit}
    stubbers["cloudformation"].add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "CDKToolkit"})


def lines(aws, environ, context=CONTEXT) -> dict[str, doctor.Finding]:
    session, _ = aws
    return {found.check: found for found in doctor.findings(context=context, session=session, environ=environ)}


def failures(found: dict[str, doctor.Finding]) -> dict[str, str]:
    return {check: finding.detail for check, finding in found.items() if not finding.ok}


def test_a_ready_account_and_machine_pass_every_check(aws, environ, capsys):
    answer(aws[1])
    found = lines(aws, environ)
    assert failures(found) == {}
    assert list(found) == [
        "credentials",
        "region",
        "config",
        "quota ml.c5.xlarge for cluster usage",
        "quota ml.trn1.32xlarge for cluster usage",
        "zone usw2-az4 offers ml.c5.xlarge",
        "zone usw2-az4 offers ml.trn1.32xlarge",
        "CDK bootstrap",
        "Docker",
        "Node.js",
        "Hugging Face token",
    ]
    assert found["quota ml.trn1.32xlarge for cluster usage"].detail == "2 wanted, quota 4"
    assert doctor.report(list(found.values())) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"OK    credentials: account 123456789012 as {ROLE_ARN}"
    assert "Node.js: v22.11.0" in out and TOKEN not in out


def test_a_quota_below_the_nodes_wanted_fails_with_the_increase_command(aws, environ):
    answer(aws[1], quotas={"ml.trn1.32xlarge": 0, "ml.c5.xlarge": 2})
    assert failures(lines(aws, environ)) == {
        "quota ml.trn1.32xlarge for cluster usage": "2 wanted, quota 0: ask for more (Service Quotas console, or "
        "aws service-quotas request-service-quota-increase --service-code sagemaker)"
    }


def test_a_zone_without_the_type_fails_naming_the_zones_that_have_it(aws, environ):
    answer(aws[1], offerings={"c5.xlarge": [ZONE], "trn1.32xlarge": ["usw2-az1", "usw2-az3"]})
    assert failures(lines(aws, environ)) == {
        "zone usw2-az4 offers ml.trn1.32xlarge": "EC2 offers trn1.32xlarge only in usw2-az1, usw2-az3: set "
        "availability_zone_id in cdk.json to one of them"
    }


@pytest.mark.parametrize(
    ("toolkit", "words"),
    [
        ({"Outputs": [{"OutputKey": "BootstrapVersion", "OutputValue": "5"}]}, "bootstrap version 5"),
        ({}, "bootstrap version none"),
    ],
)
def test_an_old_cdk_bootstrap_fails_with_the_bootstrap_command(aws, environ, toolkit, words):
    answer(aws[1], toolkit=toolkit)
    detail = failures(lines(aws, environ))["CDK bootstrap"]
    assert words in detail and "npx --no-install cdk bootstrap" in detail


def test_a_missing_cdk_bootstrap_fails_with_the_bootstrap_command(aws, environ):
    answer(aws[1], toolkit_error=("ValidationError", "Stack with id CDKToolkit does not exist", 400))
    assert failures(lines(aws, environ)) == {
        "CDK bootstrap": "no CDKToolkit stack in us-west-2: run `npx --no-install cdk bootstrap` once for this "
        "account and region (docs/deploy.md)"
    }


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("ExpiredToken", "AWS credentials have expired (ExpiredToken): refresh them"),
        ("InvalidClientTokenId", "AWS rejected the credentials (InvalidClientTokenId)"),
    ],
)
def test_failing_credentials_fail_and_skip_the_account_checks(aws, environ, code, words):
    aws[1]["sts"].add_client_error("get_caller_identity", code, "no", 403)
    found = failures(lines(aws, environ))
    assert found["credentials"].startswith(words)
    assert found["quotas, zone, CDK bootstrap"] == "not checked: fix the credentials first"
    assert set(found) == {"credentials", "quotas, zone, CDK bootstrap"}


def test_a_check_not_run_is_no_failure_of_its_own(aws, environ, capsys):
    aws[1]["sts"].add_client_error("get_caller_identity", "ExpiredToken", "no", 403)
    found = doctor.findings(context=CONTEXT, session=aws[0], environ=environ)
    assert doctor.report(found) == 1
    out = capsys.readouterr().out
    assert "SKIP  quotas, zone, CDK bootstrap: not checked: fix the credentials first" in out
    failed = sum(line.startswith("FAIL") for line in out.splitlines())
    assert out.splitlines()[-1] == f"{failed} check(s) failed; 1 not checked (they need the failed ones)"


def test_denied_quota_reading_names_the_call(aws, environ):
    answer(aws[1], quota_error=("AccessDeniedException", "not yours", 400))
    assert failures(lines(aws, environ)) == {
        "quotas": "not allowed to read the SageMaker quotas (service-quotas ListServiceQuotas): not yours"
    }


def test_a_bad_region_and_a_bad_config_fail_with_what_to_set(aws, environ):
    aws[1]["sts"].add_response("get_caller_identity", {"Account": "123456789012", "Arn": ROLE_ARN, "UserId": "AID"})
    aws[1]["cloudformation"].add_response(
        "describe_stacks",
        {"Stacks": [{"StackName": "CDKToolkit", "CreationTime": "2024-01-01", "StackStatus": "CREATE_COMPLETE"}]},
    )
    found = failures(lines(aws, environ, context={**CONTEXT, "region": "moon-east-1"}))
    assert found["region"].startswith("'moon-east-1' is not a region where SageMaker has an endpoint: set `region`")
    assert "config key 'region'" in found["config"]


def test_local_tools_missing_or_broken_fail_with_the_fix(aws, environ, tmp_path):
    answer(aws[1])
    bin_dir = Path(environ["PATH"])
    (bin_dir / "docker").unlink()
    tool(bin_dir, "node", "echo v16.20.2")
    no_stack = ("ValidationError", "Stack with id HyperPodLlamaLora does not exist", 400)
    aws[1]["cloudformation"].add_client_error("describe_stacks", *no_stack)
    found = failures(lines(aws, {**environ, "HF_TOKEN": ""}))
    assert found["Docker"].startswith("no `docker` on PATH: install Docker")
    assert found["Node.js"] == "v16.20.2 found: " + node_verdict(16)[1]
    assert found["Hugging Face token"].startswith("none found: gated models")


def test_a_docker_without_its_daemon_fails_with_what_it_said(aws, environ):
    answer(aws[1])
    tool(Path(environ["PATH"]), "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    assert failures(lines(aws, environ))["Docker"] == (
        "`docker info` exited 1 (Cannot connect to the Docker daemon): start the Docker daemon, or add your user "
        "to the docker group"
    )


def test_the_login_token_file_counts_and_is_not_printed(aws, environ):
    answer(aws[1])
    token_file = Path(environ["HF_HOME"]) / "token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN)
    found = lines(aws, {**environ, "HF_TOKEN": ""})["Hugging Face token"]
    assert found.ok and TOKEN not in found.detail


def test_the_cli_exits_1_on_a_failure(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cdk.json").write_text(json.dumps({"context": {**CONTEXT, "region": "moon-east-1"}}))
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  credentials: no AWS credentials found" in out
    assert "FAIL  region: 'moon-east-1'" in out


FILLER, TOKEN_VERSION = "0" * 31 + "1", "0" * 31 + "2"  # version ids: 32 characters at least (the model)
SECRET_ARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:HubTokenSecret-AbCdEf"


def answer_stack_secret(stubbers, stages: dict[str, list[str]]) -> None:
    """The deployed stack names its token secret; DescribeSecret lists the versions' stages (never the value)."""
    stack = {
        "StackName": "HyperPodLlamaLora",
        "CreationTime": "2024-01-01",
        "StackStatus": "UPDATE_COMPLETE",
        "Outputs": [{"OutputKey": "HfTokenSecretArn", "OutputValue": SECRET_ARN}],
    }
    stubbers["cloudformation"].add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "HyperPodLlamaLora"})
    stubbers["secretsmanager"].add_response(
        "describe_secret", {"ARN": SECRET_ARN, "VersionIdsToStages": stages}, {"SecretId": SECRET_ARN}
    )


def test_the_stacks_filled_secret_stands_in_for_a_local_token(aws, environ):
    """`hpctl secret set hf-token` put a version over the stack's filler: no local HF_TOKEN is needed."""
    answer(aws[1])
    answer_stack_secret(aws[1], {FILLER: ["AWSPREVIOUS"], TOKEN_VERSION: ["AWSCURRENT"]})
    found = lines(aws, {**environ, "HF_TOKEN": ""})["Hugging Face token"]
    assert found.ok and SECRET_ARN in found.detail and "not read" in found.detail


def test_the_stacks_unfilled_secret_does_not_count(aws, environ):
    answer(aws[1])
    answer_stack_secret(aws[1], {FILLER: ["AWSCURRENT"]})
    found = failures(lines(aws, {**environ, "HF_TOKEN": ""}))
    assert found["Hugging Face token"].startswith("none found: gated models")
    assert "hpctl secret set hf-token" in found["Hugging Face token"]
