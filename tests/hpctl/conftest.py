"""A deployed project as AWS would show it, played by moto: stack outputs, cluster, FSx, bucket, logs.

`deployed` builds it in-process under mock_aws; `moto_server` serves the same state over HTTP to
an hpctl child process (the `shell` path replaces its process with the AWS CLI, so it must run as one).
Both put a project folder (cdk.json, payloads/configs/) in the current directory.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.cloudformation.models import Event, cloudformation_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.logs.models import logs_backends
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.sagemaker.models import sagemaker_backends

from cluster_contract import CLUSTER_FACTS_KEY, StackOutput
from hpctl.cli import main

REGION = "us-west-2"
# One session for the fixtures' own clients: it keeps botocore's parsed service models between tests.
FIXTURE_SESSION = boto3.Session(region_name=REGION)
STACK = "HplTestStack"
CLUSTER = "hpl-test-cluster"
BUCKET = "sagemaker-hpl-test-bucket"
CONFIG_TEXT = '[model]\nid = "tiny"\n'
FACTS = {
    "cluster_name": CLUSTER,
    "region": REGION,
    "bucket": BUCKET,
    "payloads_dir": "/fsx/payloads",
    "outputs_dir": "/fsx/outputs",
    "default_user": "ubuntu",
    "controller_group": "controller",
    "compute_group": "compute",
}


@dataclass
class Deployment:
    cluster_arn: str
    fsx_id: str
    region: str = REGION
    stack: str = STACK
    cluster: str = CLUSTER
    bucket: str = BUCKET
    config_text: str = CONFIG_TEXT

    @property
    def cluster_id(self) -> str:
        return self.cluster_arn.rsplit("/", 1)[-1]

    def set_cluster(self, *, status: str, failure: str = "") -> None:
        """Move the fake cluster to a state moto never reaches on its own (it is InService at once)."""
        cluster = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[CLUSTER]
        cluster.status, cluster.failure_message = status, failure

    def set_stack_status(self, status: str) -> None:
        backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
        next(stack for stack in backend.stacks.values() if stack.name == STACK).status = status

    def add_instance_group(self, **group: object) -> None:
        """One more group as DescribeCluster reports it (moto keeps what CreateCluster was given)."""
        sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[CLUSTER].instance_groups.append(group)

    def remove_nodes(self) -> None:
        sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[CLUSTER].nodes.clear()

    def roll_back_first_create(self) -> None:
        """A first deploy whose cluster failed: CloudFormation deleted the cluster and every output,
        and kept the stack (ROLLBACK_COMPLETE) with its template, which names the cluster."""
        FIXTURE_SESSION.client("sagemaker").delete_cluster(ClusterName=CLUSTER)
        cloudformation = FIXTURE_SESSION.client("cloudformation")
        cloudformation.delete_stack(StackName=STACK)
        template = {
            "Resources": {
                "Placeholder": {"Type": "AWS::SNS::Topic"},
                "HyperPodCluster": {"Type": "AWS::SageMaker::Cluster", "Properties": {"ClusterName": CLUSTER}},
            }
        }
        with warnings.catch_warnings():  # moto cannot create the cluster type and says so; the template is what counts
            warnings.simplefilter("ignore")
            cloudformation.create_stack(StackName=STACK, TemplateBody=json.dumps(template))
        self.set_stack_status("ROLLBACK_COMPLETE")


def _set_log_group_created(name: str, when: datetime) -> None:
    naive_utc = when.astimezone(timezone.utc).replace(tzinfo=None)  # how moto keeps times
    logs_backends[DEFAULT_ACCOUNT_ID][REGION].groups[name].creation_time = naive_utc


@pytest.fixture
def log_group_created():
    """Set when a log group was created (moto stamps the present; HyperPod's groups come from past creates)."""
    return _set_log_group_created


def _add_stack_event(stack: str, logical_id: str, resource_type: str, status: str, reason: str = "") -> None:
    backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
    target = next(item for item in backend.stacks.values() if item.name == stack)
    target.events.append(
        Event(
            stack_id=target.stack_id,
            stack_name=stack,
            logical_resource_id=logical_id,
            physical_resource_id="",
            resource_type=resource_type,
            resource_status=status,
            resource_status_reason=reason or None,
            resource_properties=None,
        )
    )


@pytest.fixture
def add_stack_event():
    """Add one event to a stack's history, as CloudFormation does while it deploys."""
    return _add_stack_event


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Fake credentials only: no real profile, config file or instance metadata can leak in."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "project"
    (root / "payloads" / "configs").mkdir(parents=True)
    cdk_json = {"app": "python3 app.py", "context": {"stack_name": STACK, "region": REGION}}
    (root / "cdk.json").write_text(json.dumps(cdk_json))
    (root / "payloads" / "configs" / "tiny.toml").write_text(CONFIG_TEXT)
    monkeypatch.chdir(root)
    return root


def build_deployment(client) -> Deployment:
    """What `cdk deploy` leaves behind, made through the AWS APIs (moto cannot deploy the real template)."""
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=BUCKET, Key=CLUSTER_FACTS_KEY, Body=json.dumps(FACTS).encode())
    s3.put_object(Bucket=BUCKET, Key="payloads/configs/tiny.toml", Body=CONFIG_TEXT.encode())
    lifecycle = {"SourceS3Uri": f"s3://{BUCKET}/lifecycle/", "OnCreate": "on_create.sh"}
    role = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/hpl-cluster"
    arn = client("sagemaker").create_cluster(
        ClusterName=CLUSTER,
        InstanceGroups=[
            {
                "InstanceGroupName": name,
                "InstanceType": kind,
                "InstanceCount": 1,
                "LifeCycleConfig": lifecycle,
                "ExecutionRole": role,
                "ThreadsPerCore": 1,
            }
            for name, kind in (("controller", "ml.c5.xlarge"), ("compute", "ml.trn1.32xlarge"))
        ],
    )["ClusterArn"]
    fsx_id = client("fsx").create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=["subnet-0123456789abcdef0"],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
    )["FileSystem"]["FileSystemId"]
    outputs = {
        StackOutput.CLUSTER_NAME: CLUSTER,
        StackOutput.CLUSTER_ARN: arn,
        StackOutput.CLUSTER_ID: arn.rsplit("/", 1)[-1],
        StackOutput.BUCKET_NAME: BUCKET,
        StackOutput.FSX_FILE_SYSTEM_ID: fsx_id,
        StackOutput.FSX_DNS_NAME: f"{fsx_id}.fsx.{REGION}.amazonaws.com",
        StackOutput.FSX_MOUNT_NAME: "abcdefgh",
        StackOutput.IMAGE_URI: f"{DEFAULT_ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/hpl-train:1",
        StackOutput.REGION: REGION,
        StackOutput.CONTROLLER_GROUP: "controller",
        StackOutput.COMPUTE_GROUP: "compute",
        StackOutput.SHELL_COMMAND: "hpctl shell",
        StackOutput.SUBMIT_COMMAND: "hpctl submit --config <name>",
    }
    client("cloudformation").create_stack(StackName=STACK, TemplateBody=outputs_template(outputs))
    return Deployment(cluster_arn=arn, fsx_id=fsx_id)


def outputs_template(outputs: dict[str, str]) -> str:
    """A template holding just the outputs (CloudFormation needs one resource; moto can create a topic)."""
    template = {"Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}}}
    if outputs:
        template["Outputs"] = {key: {"Value": value} for key, value in outputs.items()}
    return json.dumps(template)


class BareStack:
    """A stack with only the given outputs and status (a deploy in progress, a foreign stack)."""

    def create(self, outputs: dict[str, str], status: str = "CREATE_COMPLETE") -> None:
        cloudformation = FIXTURE_SESSION.client("cloudformation")
        cloudformation.create_stack(StackName=STACK, TemplateBody=outputs_template(outputs))
        self.set_status(status)
        if status != "CREATE_COMPLETE":  # moto creates at once; a real create has only begun
            stack = next(
                s for s in cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION].stacks.values() if s.name == STACK
            )
            stack.events = [event for event in stack.events if event.resource_status != "CREATE_COMPLETE"]

    def set_status(self, status: str) -> None:
        Deployment(cluster_arn="", fsx_id="").set_stack_status(status)

    def finish_deploy(self) -> Deployment:
        """What the deploy leaves once it completes: the full stack with outputs and its cluster."""
        FIXTURE_SESSION.client("cloudformation").delete_stack(StackName=STACK)
        return build_deployment(FIXTURE_SESSION.client)


@pytest.fixture
def bare_stack(aws_env, project):
    with mock_aws():
        yield BareStack()


@pytest.fixture
def deployed(aws_env, project) -> Deployment:
    with mock_aws():
        yield build_deployment(FIXTURE_SESSION.client)


@pytest.fixture(scope="session")
def _server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_server(_server, aws_env, project, monkeypatch) -> Deployment:
    """The deployment behind an HTTP endpoint; AWS_ENDPOINT_URL points this process and its children at it."""
    urllib.request.urlopen(urllib.request.Request(f"{_server}/moto-api/reset", method="POST")).close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", _server)
    return build_deployment(FIXTURE_SESSION.client)


@pytest.fixture
def hpctl(capsys):
    """Run the CLI in-process: (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


RECORDER = """\
#!{python}
# Stands in for the AWS CLI: records its arguments, replays a session's output, exits as told.
import json, os, sys
with open(os.environ["HPCTL_TEST_RECORD"], "w") as record:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, record)
replay = os.environ.get("HPCTL_TEST_REPLAY")
if replay and os.path.exists(replay):
    sys.stdout.write(open(replay).read())
sys.exit(int(os.environ.get("HPCTL_TEST_RC", "0")))
"""


@dataclass
class Recorder:
    bin_dir: Path
    record: Path
    replay: Path

    def calls(self) -> list[str]:
        return json.loads(self.record.read_text())["argv"]

    def replay_session(self, *lines: str) -> None:
        """Make `aws` print what `ssm start-session` prints around a command's output (CRLF, as over SSM)."""
        framing = [
            "",
            "Starting session with SessionId: tester-0123456789abcdef0",
            "",
            *lines,
            "",
            "",
            "Exiting session with sessionId: tester-0123456789abcdef0.",
            "",
            "",
        ]
        self.replay.write_text("\r\n".join(framing))


@pytest.fixture
def session_tools(tmp_path, monkeypatch) -> Recorder:
    """`aws` (the recorder) and `session-manager-plugin` alone on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    aws = bin_dir / "aws"
    aws.write_text(RECORDER.format(python=sys.executable))
    plugin = bin_dir / "session-manager-plugin"
    plugin.write_text("#!/bin/sh\nexit 0\n")
    for tool in (aws, plugin):
        tool.chmod(0o755)
    recorder = Recorder(bin_dir=bin_dir, record=tmp_path / "aws-argv.json", replay=tmp_path / "session-output.txt")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HPCTL_TEST_RECORD", str(recorder.record))
    monkeypatch.setenv("HPCTL_TEST_REPLAY", str(recorder.replay))
    return recorder
