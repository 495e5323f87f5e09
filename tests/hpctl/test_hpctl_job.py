"""`hpctl job`: the pipeline as a SageMaker training job, built by the pinned sagemaker SDK against moto.

The CreateTrainingJob request the SDK sends is captured on the wire side of botocore, validated
against botocore's service model and compared with the run config; bad input stops before any upload.
The SDK's own checks stay on: its role check asks IAM (iam:SimulatePrincipalPolicy, GetRole), which
moto lacks, so botocore's Stubber answers from the role the jobs-only template really grants
(iam_simulation.py).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from botocore.validate import ParamValidator
from iam_simulation import SNAPSHOT, JobRole, stand_in_arn
from metric_lines import estimate_json, trainer_lines, verdict
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends
from price_list_stub import price_item
from price_list_stub import stubbed_pricing as stub_price_list

from hpctl.common.pricing import hourly_price
from hpctl.jobs import commands as job_commands
from hpctl.jobs import job_status
from hpctl.jobs.job_spec import METRIC_DEFINITIONS
from hpctl.jobs.job_status import render_status, stop_job

REPO = Path(__file__).resolve().parents[2]
REGION, STACK = "us-west-2", "HplTestStack"  # what the `project` fixture's cdk.json names
FIXTURE_SESSION = boto3.Session(region_name=REGION)
BUCKET = "sagemaker-hpl-jobs-bucket"
ROLE = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/hpl-job"
NEURON_IMAGE = f"{DEFAULT_ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/hpl-neuron:1"
CUDA_IMAGE = f"{DEFAULT_ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/hpl-cuda:1"
TOKEN_SECRET = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:hpl-hub-token-AbCdEf"
OUTPUTS = {
    "BucketName": BUCKET,
    "JobRoleArn": ROLE,
    "NeuronImageUri": NEURON_IMAGE,
    "CudaImageUri": CUDA_IMAGE,
    "HfTokenSecretArn": TOKEN_SECRET,
}


def outputs_template(outputs: dict[str, str]) -> str:
    template = {"Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}}, "Outputs": {}}
    template["Outputs"] = {key: {"Value": value} for key, value in outputs.items()}
    return json.dumps(template)


@pytest.fixture
def jobs_stack(aws_env, project, monkeypatch, tmp_path):
    """A jobs-only deployment: bucket, role and images as stack outputs; the project's real run configs."""
    cdk_context = json.loads((project / "cdk.json").read_text())["context"]
    assert (cdk_context["stack_name"], cdk_context["region"]) == (STACK, REGION)
    for name in ("default.toml", "tiny-cpu.toml"):
        shutil.copy2(REPO / "payloads" / "configs" / name, project / "payloads" / "configs" / name)
    sdk_config = tmp_path / "sagemaker-config.yaml"
    sdk_config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(sdk_config))
    with mock_aws():
        s3 = FIXTURE_SESSION.client("s3")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        FIXTURE_SESSION.client("cloudformation").create_stack(StackName=STACK, TemplateBody=outputs_template(OUTPUTS))
        yield s3


@dataclass
class IamAnswers:
    role: JobRole  # its statements may be changed before a submit
    stubbers: list[Stubber]  # one per hpctl command


def sdk_checked_actions() -> list[str]:
    """What the SDK's role check simulates: its training role's actions granted on '*' (iam_role_resolver)."""
    from sagemaker.core.helper.iam_policies import IAM_POLICY_CONFIG

    statements = [s for doc in IAM_POLICY_CONFIG["training"]["policies"].values() for s in doc["Statement"]]
    as_list = lambda value: [value] if isinstance(value, str) else list(value)  # noqa: E731
    return [action for s in statements if "*" in as_list(s.get("Resource", [])) for action in as_list(s["Action"])]


@pytest.fixture
def iam(monkeypatch):
    """IAM as the SDK asks it while building a job, answered for the stack's job role: its check
    (SimulatePrincipalPolicy on the '*' actions, GetRole for the trust policy), then one s3:PutObject
    simulation per channel the SDK stages (code, sm_drivers) to pick the staging bucket."""
    answers = IamAnswers(role=JobRole(bucket=BUCKET), stubbers=[])
    role = answers.role
    real_connect = job_commands.connect

    def connect(args):
        deployment = real_connect(args)
        client = FIXTURE_SESSION.client("iam")
        stubber = Stubber(client)
        actions = sdk_checked_actions()
        check = {"PolicySourceArn": ROLE, "ActionNames": actions}
        stubber.add_response("simulate_principal_policy", role.simulate(actions), check)
        stubber.add_response("get_role", role.get_role(ROLE), {"RoleName": ROLE.split(":role/")[1]})
        bucket_objects = [f"arn:aws:s3:::{BUCKET}/*"]
        staging = {"PolicySourceArn": ROLE, "ActionNames": ["s3:PutObject"], "ResourceArns": bucket_objects}
        for _ in ("code", "sm_drivers"):
            stubber.add_response("simulate_principal_policy", role.simulate(["s3:PutObject"], bucket_objects), staging)
        stubber.activate()
        answers.stubbers.append(stubber)
        clients = deployment.session.client
        deployment.session.client = lambda name, *a, **kw: client if name == "iam" else clients(name, *a, **kw)
        return deployment

    monkeypatch.setattr(job_commands, "connect", connect)
    return answers


@pytest.fixture
def requests_sent(monkeypatch, iam):
    """Every CreateTrainingJob request botocore is about to send, as the service model sees it."""
    sent: list[dict] = []
    ACTIONS_CALLED.clear()
    real_connect = job_commands.connect

    def connect(args):
        deployment = real_connect(args)
        deployment.session.events.register(
            "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: sent.append(params)
        )
        deployment.session.events.register("before-call.*.*", record_action)
        return deployment

    def record_action(model, **_):
        ACTIONS_CALLED.add(f"{model.service_model.signing_name}:{model.name}")

    monkeypatch.setattr(job_commands, "connect", connect)
    return sent


ACTIONS_CALLED: set[str] = set()  # service:Operation of every call the SDK and hpctl made (moto answered)
# Operations whose IAM action has another name; and what IAM checks beyond the calls themselves.
IAM_ACTION_OF = {"s3:ListObjectsV2": "s3:ListBucket", "s3:ListBuckets": "s3:ListAllMyBuckets"}
IMPLIED_ACTIONS = {"iam:PassRole", "sagemaker:AddTags"}  # CreateTrainingJob's RoleArn and Tags
# The SDK's role check (stubbed, so not in ACTIONS_CALLED); without them it warns and goes on.
ROLE_CHECK_ACTIONS = {"iam:SimulatePrincipalPolicy", "iam:GetRole"}


def documented_caller_actions() -> set[str]:
    """The actions docs/jobs.md's "Who may submit" table lists (first column, in backticks)."""
    text = (REPO / "docs" / "jobs.md").read_text()
    section = text.split("## Who may submit", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+:[A-Za-z]+)`", section, flags=re.MULTILINE))


def sagemaker():
    return FIXTURE_SESSION.client("sagemaker")


def valid_request(params: dict) -> dict:
    model = FIXTURE_SESSION._session.get_service_model("sagemaker").operation_model("CreateTrainingJob")
    report = ParamValidator().validate(params, model.input_shape)
    assert not report.has_errors(), report.generate_report()
    return params


def channel_uris(request: dict) -> dict[str, str]:
    return {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}


def read_s3_json(s3, uri: str) -> dict:
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_submit_builds_the_job_the_run_config_describes(jobs_stack, iam, requests_sent, hpctl):
    s3 = jobs_stack
    s3.put_object(Bucket=BUCKET, Key="models/tiny-llama/config.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")

    code, out, err = hpctl(
        "job", "submit", "--config", "tiny-cpu", "--instance-count", "2", "--spot", "--tag", "team=ml"
    )

    assert code == 0, err
    iam.stubbers[-1].assert_no_pending_responses()  # the SDK checked the role (and passed it) first
    called = {IAM_ACTION_OF.get(action, action) for action in ACTIONS_CALLED}
    assert called | IMPLIED_ACTIONS | ROLE_CHECK_ACTIONS <= documented_caller_actions()
    (request,) = requests_sent
    valid_request(request)
    name = request["TrainingJobName"]
    assert name.startswith("hpl-tiny-lora-") and f"created training job {name}" in out
    assert request["AlgorithmSpecification"]["TrainingImage"] == CUDA_IMAGE  # a CPU type runs the CUDA image
    assert request["RoleArn"] == ROLE
    assert request["ResourceConfig"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30}
    channels = channel_uris(request)
    assert channels["models"] == f"s3://{BUCKET}/models/tiny-llama/"  # keyed by the model: any run reuses it
    assert request["Environment"]["HPL_MODEL_FOLDER"] == "tiny-llama"
    assert request["Environment"]["HPL_HF_TOKEN_SECRET_ARN"] == TOKEN_SECRET  # the ARN only; the job reads the token
    assert channels["datasets"] == f"s3://{BUCKET}/datasets/tiny-lora/"
    # The role may write only under jobs/ and outputs/, so the SDK stages below the output path.
    assert channels["code"] == f"s3://{BUCKET}/jobs/tiny-lora/jobs/tiny-lora/{name}/input/code"
    assert request["CheckpointConfig"] == {
        "S3Uri": f"s3://{BUCKET}/outputs/tiny-lora/",
        "LocalPath": "/opt/ml/checkpoints/tiny-lora",
    }
    assert request["TensorBoardOutputConfig"] == {
        "S3OutputPath": f"s3://{BUCKET}/jobs/tiny-lora/tensorboard/",
        "LocalPath": "/opt/ml/checkpoints/tiny-lora/tensorboard",
    }
    assert request["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/jobs/tiny-lora/"
    metrics = {m["Name"]: m["Regex"] for m in request["AlgorithmSpecification"]["MetricDefinitions"]}
    assert metrics == METRIC_DEFINITIONS  # the rehearsal matches them against a real run's log
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    tags = {tag["Key"]: tag["Value"] for tag in request["Tags"]}
    assert tags["hpl-run"] == "tiny-lora" and tags["hpl-config"] == "tiny-cpu.toml" and tags["team"] == "ml"
    # The code channel holds the payload package and the run config; the SDK's driver runs our command.
    code_key = channels["code"].removeprefix(f"s3://{BUCKET}/")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=code_key)["Contents"]}
    assert f"{code_key}/llm_pipeline/sagemaker_job.py" in keys and f"{code_key}/configs/tiny-cpu.toml" in keys
    source_code = read_s3_json(s3, channels["sm_drivers"] + "/sourcecode.json")
    assert source_code["command"] == "python3 -m llm_pipeline.sagemaker_job --config configs/tiny-cpu.toml"
    assert sagemaker().describe_training_job(TrainingJobName=name)["RoleArn"] == ROLE


def test_the_sdk_check_passes_the_bounded_role_and_still_refuses_what_it_can_prove(
    jobs_stack, iam, requests_sent, hpctl, caplog
):
    """The SDK's check stays on. The EC2 actions it asks about are outside the role's boundary, which
    the SDK calls unverifiable: it warns and goes on. An explicit deny it can prove still stops it."""
    jobs_stack.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    assert iam.role.decision("ec2:CreateNetworkInterface") == "implicitDeny"
    assert not iam.role.allowed_by_boundary("ec2:CreateNetworkInterface")
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu")
    assert code == 0, err
    assert "Could not verify permissions for role" in caplog.text
    iam.role.statements.append({"Effect": "Deny", "Action": "ecr:GetAuthorizationToken", "Resource": "*"})
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu")
    assert code == 2 and f"execution role {ROLE}: IAM role '{ROLE}' cannot be used" in err
    assert "ecr:GetAuthorizationToken" in err.split("Missing permissions:")[1].splitlines()[0]
    assert len(requests_sent) == 1


def test_without_its_boundary_the_role_would_need_the_vpc_actions(jobs_stack, iam, requests_sent, hpctl):
    """Why the boundary is there: a role without one is judged on its policies alone, and the SDK
    refuses it for the EC2 network-interface actions SageMaker uses only for VPC-mode jobs."""
    iam.role.boundary = None
    jobs_stack.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu")
    assert code == 2 and "ec2:CreateNetworkInterface" in err.split("Missing permissions:")[1].splitlines()[0]
    assert not requests_sent and nothing_created(jobs_stack)


def s3_object_arn(uri: str, key: str = "x") -> str:
    return f"arn:aws:s3:::{uri.removeprefix('s3://').rstrip('/')}/{key}"


def test_the_job_role_has_every_action_a_job_makes(jobs_stack, iam, requests_sent, hpctl):
    """What SageMaker and our code do as the role while the job runs, on the resources the request
    names: pull the image, read the channels, write checkpoints, TensorBoard and artifacts, log, report
    metrics. Each must be allowed by the role's policy and by its boundary."""
    jobs_stack.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu")
    assert code == 0, err
    request = valid_request(requests_sent[0])
    name = request["TrainingJobName"]
    # The stack's own image repository (the jobs-only template's image output), not the test's stand-in.
    template = json.loads(SNAPSHOT.read_text())
    image = template["Outputs"]["NeuronImageUri"]["Value"]["Fn::Sub"]
    account, _, _, region = image.split("/")[0].split(".")[:4]
    repository = f"arn:aws:ecr:{region}:{account}:repository/{image.split('/')[1].split(':')[0]}"
    log_group = f"arn:aws:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs"
    calls = [
        ("ecr:GetAuthorizationToken", "*", {}),
        *[(action, repository, {}) for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")],
        ("ecr:BatchCheckLayerAvailability", repository, {}),
        ("logs:CreateLogStream", f"{log_group}:log-stream:{name}/algo-1-1767225600", {}),
        ("logs:PutLogEvents", f"{log_group}:log-stream:{name}/algo-1-1767225600", {}),
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}),
    ]
    for uri in channel_uris(request).values():
        prefix = uri.removeprefix(f"s3://{BUCKET}/")
        calls += [
            ("s3:GetObject", s3_object_arn(uri), {}),
            ("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": f"{prefix.rstrip('/')}/x"}),
        ]
    for uri in (
        request["OutputDataConfig"]["S3OutputPath"],
        request["CheckpointConfig"]["S3Uri"],
        request["TensorBoardOutputConfig"]["S3OutputPath"],
    ):
        calls += [(action, s3_object_arn(uri), {}) for action in ("s3:PutObject", "s3:AbortMultipartUpload")]
    # The download step reads the Hugging Face token: the secret, and its key through Secrets Manager only.
    resources = template["Resources"]
    (secret,) = [key for key, res in resources.items() if res["Type"] == "AWS::SecretsManager::Secret"]
    key = resources[secret]["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]  # the secret's key (the logs have their own)
    secret_arn, key_arn = stand_in_arn("AWS::SecretsManager::Secret", secret), stand_in_arn("AWS::KMS::Key", key)
    calls += [
        ("secretsmanager:GetSecretValue", secret_arn, {}),
        ("kms:Decrypt", key_arn, {"kms:ViaService": f"secretsmanager.{region}.amazonaws.com"}),
    ]
    refused = [(a, r) for a, r, context in calls if iam.role.decision(a, r, context) != "allowed"]
    assert refused == []
    # And nothing beyond the bucket's job folders: another bucket, or the metrics of another namespace.
    assert iam.role.decision("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/x") == "implicitDeny"
    assert iam.role.decision("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "Other"}) == "implicitDeny"
    assert iam.role.decision("kms:Decrypt", key_arn, {"kms:ViaService": f"s3.{region}.amazonaws.com"}) == "implicitDeny"
    assert iam.role.decision("secretsmanager:GetSecretValue", f"{secret_arn}-other") == "implicitDeny"


def test_a_warm_pool_keeps_the_instances_for_the_next_job(jobs_stack, requests_sent, hpctl):
    jobs_stack.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    code, out, err = hpctl("job", "submit", "--config", "tiny-cpu", "--keep-alive-minutes", "30")
    assert code == 0, err
    assert valid_request(requests_sent[0])["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert "warm pool  the instances stay 30 min after the job" in out
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu", "--keep-alive-minutes", "361", "--dry-run")
    assert code == 2 and "--keep-alive-minutes must be 0 to 360" in err


def test_neuron_run_gets_the_neuron_image_and_its_cores(jobs_stack, requests_sent, hpctl):
    code, out, err = hpctl("job", "submit", "--config", "default")

    assert code == 0, err
    request = valid_request(requests_sent[0])
    assert request["AlgorithmSpecification"]["TrainingImage"] == NEURON_IMAGE
    assert request["ResourceConfig"]["InstanceType"] == "ml.trn1.32xlarge"
    assert request["Environment"]["HPL_DEVICES_PER_NODE"] == "32"  # torchrun processes per host
    assert "EnableManagedSpotTraining" not in request or request["EnableManagedSpotTraining"] is False
    assert set(channel_uris(request)) == {"code", "sm_drivers"}  # no model in S3: the job downloads it
    assert "model      not in s3://sagemaker-hpl-jobs-bucket/models/Meta-Llama-3-8B/: the job downloads it" in out
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 24 * 3600}
    assert "already holds files" not in out
    cache = f"s3://{BUCKET}/neuron-cache/"  # the stack's compile cache, shared by its Neuron jobs
    assert request["Environment"]["HPL_COMPILE_CACHE_URI"] == cache
    assert f"compile    {cache} is empty: this job compiles, then writes its cache there for the next" in out
    jobs_stack.put_object(Bucket=BUCKET, Key="outputs/llama3-8b-dolly-lora/checkpoints/checkpoint-5/x", Body=b"")
    code, out, _ = hpctl("job", "submit", "--config", "default", "--dry-run")
    assert code == 0 and "the run folder already holds files: train resumes from its newest checkpoint" in out
    jobs_stack.put_object(Bucket=BUCKET, Key="neuron-cache/neuronxcc-2.21/MODULE_1/model.neff", Body=b"")
    code, out, err = hpctl("job", "submit", "--config", "default")
    assert code == 0, err
    assert channel_uris(valid_request(requests_sent[1]))["neuron_cache"] == cache
    assert f"channel    neuron_cache <- {cache}" in out and "is empty" not in out


def test_the_job_runs_its_smoke_stage_unless_told_not_to(jobs_stack, hpctl, capsys):
    code, out, err = hpctl("job", "submit", "--config", "default", "--dry-run")
    assert code == 0 and "python3 -m llm_pipeline.sagemaker_job --config configs/default.toml\n" in out, err
    code, out, _ = hpctl("job", "submit", "--config", "default", "--dry-run", "--no-smoke")
    assert code == 0 and "python3 -m llm_pipeline.sagemaker_job --config configs/default.toml --no-smoke\n" in out
    # --to: the job's entry stops after that step (tests/jobs/test_job_rehearsal.py runs it); a step the job lacks
    # is refused by name before anything is asked of AWS
    code, out, _ = hpctl("job", "submit", "--config", "default", "--dry-run", "--to", "merge")
    assert code == 0 and "python3 -m llm_pipeline.sagemaker_job --config configs/default.toml --to merge\n" in out
    with pytest.raises(SystemExit) as stop:
        hpctl("job", "submit", "--config", "default", "--dry-run", "--to", "smoke-merge")
    assert stop.value.code == 2 and "argument --to: invalid choice: 'smoke-merge'" in capsys.readouterr().err


def nothing_created(s3) -> bool:
    return not sagemaker().list_training_jobs()["TrainingJobSummaries"] and "Contents" not in s3.list_objects_v2(
        Bucket=BUCKET, Prefix="jobs/"
    )


@pytest.mark.parametrize(
    ("config", "extra", "message"),
    [
        ("tiny-cpu", ["--instance-type", "ml.m5.huge"], "'ml.m5.huge' is not a SageMaker training instance type"),
        ("tiny-cpu", ["--instance-type", "ml.trn1.32xlarge"], "train.backend = 'torch' cannot run on ml.trn1.32xlarge"),
        ("tiny-cpu", ["--instance-type", "ml.g5.xlarge"], None),  # one process on one GPU: allowed (dry run)
        ("default", ["--instance-type", "ml.g5.xlarge"], "parallel.devices_per_node = 32, but ml.g5.xlarge has 1 GPUs"),
        ("tiny-cpu", ["--instance-type", "ml.p3.2xlarge"], "V100 GPUs (compute capability 7.0) cannot run the CUDA"),
        ("tiny-cpu", ["--instance-type", "ml.r5.xlarge"], "ml.r5.xlarge has no row in stacks/accelerators.py"),
        (
            "default",  # its neuron backend is trn1's: the lane is named, not the backend
            ["--instance-type", "ml.trn2.48xlarge"],
            "--instance-type: ml.trn2.48xlarge (Trainium2) runs the torchneuron image, which SageMaker training jobs "
            "do not run yet: submit this run on the cluster lane (hpctl submit",
        ),
        ("tiny-cpu", ["--instance-type", "ml.g5.xlarge", "--image", NEURON_IMAGE], "NeuronImageUri (neuron image)"),
    ],
)
def test_instance_type_and_backend_are_checked_first(jobs_stack, hpctl, config, extra, message):
    jobs_stack.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    code, out, err = hpctl("job", "submit", "--config", config, "--dry-run", *extra)
    if message is None:
        assert code == 0 and "dry run: nothing created" in out and CUDA_IMAGE in out
    else:
        assert code == 2 and message in err
    assert nothing_created(jobs_stack)


def write_config(project: Path, name: str, text: str) -> str:
    (project / "payloads" / "configs" / f"{name}.toml").write_text(text)
    return name


@pytest.mark.parametrize(
    ("text", "instance_type", "message"),
    [
        ('[train]\nmethod = "qlora"\n', "ml.trn1.32xlarge", "train.method: 'qlora' cannot run on the neuron backend"),
        ('[train]\nmethod = "qlora"\nbackend = "torch"\n', "ml.m5.xlarge", "4-bit NF4 bases need bitsandbytes"),
        ('[paths]\noutput_dir = "/fsx/outputs/x"\n', "ml.trn1.32xlarge", "paths.output_dir = '/fsx/outputs/x' is not"),
        ('[data]\ndataset = "${HPL_DATASETS_DIR}/d.jsonl"\n', "ml.trn1.32xlarge", "upload it first"),
    ],
)
def test_runs_that_cannot_work_there_stop_before_anything_is_created(
    jobs_stack, project, hpctl, text, instance_type, message
):
    name = write_config(project, "bad", text)
    code, _, err = hpctl("job", "submit", "--config", name, "--instance-type", instance_type)
    assert code == 2 and message in err, err
    assert nothing_created(jobs_stack)


def test_a_missing_image_for_the_accelerator_is_named(jobs_stack, project, hpctl):
    FIXTURE_SESSION.client("cloudformation").update_stack(
        StackName=STACK, TemplateBody=outputs_template({k: v for k, v in OUTPUTS.items() if k != "CudaImageUri"})
    )
    name = write_config(project, "eight-gpus", "[parallel]\ndevices_per_node = 8\n")
    code, _, err = hpctl("job", "submit", "--config", name, "--instance-type", "ml.p5.48xlarge")
    assert code == 2 and "no training image for cuda instances such as ml.p5.48xlarge (output CudaImageUri)" in err
    assert nothing_created(jobs_stack)


def price_list(usage_type: str, usd: str) -> str:
    return price_item(usage_type, usd, REGION)


def stubbed_pricing(items: list[str]):
    return stub_price_list(items, usage_suffix="-Train:ml.m5.xlarge", region=REGION)


def test_price_comes_from_the_exact_on_demand_training_usage_type():
    client = stubbed_pricing(
        [price_list("USW2-Spot-Train:ml.m5.xlarge", "9.0"), price_list("USW2-Train:ml.m5.xlarge", "2.5")]
    )
    price = hourly_price(client, "ml.m5.xlarge", REGION)
    assert (price.usd, price.usage_type) == (2.5, "USW2-Train:ml.m5.xlarge")
    assert hourly_price(stubbed_pricing([]), "ml.m5.xlarge", REGION) is None


def submit_tiny(s3, hpctl) -> None:
    s3.put_object(Bucket=BUCKET, Key="datasets/tiny-lora/tiny-dolly.jsonl", Body=b"{}\n")
    code, _, err = hpctl("job", "submit", "--config", "tiny-cpu")
    assert code == 0, err


def test_status_shows_billable_seconds_and_cost(jobs_stack, requests_sent, hpctl, monkeypatch, capsys, tmp_path):
    submit_tiny(jobs_stack, hpctl)
    name = requests_sent[0]["TrainingJobName"]
    monkeypatch.setattr(
        job_commands, "pricing_client", lambda session: stubbed_pricing([price_list("USW2-Train:ml.m5.xlarge", "2.5")])
    )

    code, out, err = hpctl("job", "status")

    assert code == 0, err
    assert f"job        {name}" in out and "status     Completed" in out
    assert "billable   0 s per instance (start to end" in out  # moto's job starts and ends at once
    assert "cost       $0.00 = 1 x 0 s x $2.5000/h (USW2-Train:ml.m5.xlarge; AWS Price List API" in out
    assert f"run folder s3://{BUCKET}/outputs/tiny-lora/" in out
    assert "Run          tiny-lora" not in out  # nothing in the run folder yet

    # The job's run folder (its checkpoint folder, synced to S3): step logs ending in their verdicts
    # (no Slurm markers in a job), the running step's metric lines, the smoke run's estimate.
    run_dir = "/opt/ml/checkpoints/tiny-lora"
    steps = [("data", "logs"), ("smoke-train", "smoke/logs"), ("estimate", "logs"), ("train", "logs")]
    record = [{"step": s, "job": "algo-1", "log": f"{run_dir}/{where}/{s}-algo-1.log"} for s, where in steps]
    files = {
        "logs/pipeline.json": json.dumps({"config": "run.toml", "steps": record}),
        "logs/data-algo-1.log": "prepared\n" + verdict("data", 4),
        "smoke/logs/smoke-train-algo-1.log": "trained\n" + verdict("smoke-train", 30),
        "logs/estimate-algo-1.log": verdict("estimate", 0),
        "logs/train-algo-1.log": trainer_lines(capsys, tmp_path, step=3, total=10),
        "logs/estimate.json": estimate_json(seconds=3600.0, nodes=2, note="billed per second"),
    }
    for key, body in files.items():
        jobs_stack.put_object(Bucket=BUCKET, Key=f"outputs/tiny-lora/{key}", Body=body.encode())
    code, out, err = hpctl("job", "status")
    assert code == 0, err
    run = out.split("Run          tiny-lora\n")[1].splitlines()
    states = [line.split() for line in run[:4]]
    assert states == [["data", "algo-1", "COMPLETED"], ["smoke-train", "algo-1", "COMPLETED"],
                      ["estimate", "algo-1", "COMPLETED"], ["train", "algo-1", "RUNNING"]]  # fmt: skip
    assert run[4].startswith("  running: train: step 3/10, loss 1.0000")
    assert run[5] == "  estimate (smoke run): 1:00:00 for the long steps, 2.000 node-hours"
    assert run[6].startswith("  cost: $5.00 = 2.000 node-hours x $2.5000/h (USW2-Train:ml.m5.xlarge;")


def test_status_arithmetic_while_running_and_when_done():
    start = datetime(2026, 11, 1, 10, 0, tzinfo=timezone.utc)
    job = {
        "TrainingJobName": "hpl-x",
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2},
        "TrainingStartTime": start,
    }
    price = type("P", (), {"usd": 10.0, "usage_type": "USW2-Train:ml.trn1.32xlarge"})()
    running = render_status(job, price, now=start + timedelta(minutes=30))
    assert "billable   1800 s per instance so far (running" in running and "cost       $10.00 so far" in running
    spot = {**job, "TrainingJobStatus": "Completed", "EnableManagedSpotTraining": True, "TrainingTimeInSeconds": 900}
    assert "spot       20 % fewer billed seconds than trained" in render_status(
        {**spot, "BillableTimeInSeconds": 720}, price
    )
    done = render_status({**job, "TrainingJobStatus": "Completed", "BillableTimeInSeconds": 720}, None)
    assert "billable   720 s per instance\n" in done
    assert "cost       not shown: no published on-demand training price for ml.trn1.32xlarge" in done


# CloudWatch Logs (and moto) refuse events over 14 days old: the streams' times are an hour ago, not a fixed date.
LOG_START_S = int(time.time()) - 3600


def test_logs_print_every_host_stream(jobs_stack, hpctl):
    logs = FIXTURE_SESSION.client("logs")
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    for host in ("algo-1", "algo-2"):
        stream = f"hpl-run-1/{host}-{LOG_START_S}"
        logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
        events = [{"timestamp": LOG_START_S * 1000 + i, "message": f"{host} line {i}"} for i in range(3)]
        logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=events)

    code, out, err = hpctl("job", "logs", "hpl-run-1", "--tail", "2")

    assert code == 0, err
    assert f"==> /aws/sagemaker/TrainingJobs hpl-run-1/algo-1-{LOG_START_S} (3 lines) <==" in out
    assert "algo-1 line 0" not in out and "algo-1 line 2" in out and "algo-2 line 1" in out


def test_logs_follow_prints_every_host_until_the_job_ends(jobs_stack, requests_sent, hpctl, monkeypatch):
    submit_tiny(jobs_stack, hpctl)
    name = requests_sent[0]["TrainingJobName"]
    logs = FIXTURE_SESSION.client("logs")
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    job = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs[name]
    job.training_job_status = "InProgress"
    lines = {"algo-1": ["== train: COMPLETED"], "algo-2": ["step 5/30 | loss 1.0000 |"]}
    for host, messages in lines.items():
        stream = f"{name}/{host}-{LOG_START_S}"
        logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
        events = [{"timestamp": LOG_START_S * 1000 + i, "message": m} for i, m in enumerate(messages)]
        logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=events)
    polls = []

    def next_poll(seconds):  # the job ends after the first poll; a later line arrives before the last read
        polls.append(seconds)
        job.training_job_status = "Completed"
        stream = f"{name}/algo-1-{LOG_START_S}"
        event = {"timestamp": LOG_START_S * 1000 + 9000, "message": "== generate: COMPLETED"}
        logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=[event])

    monkeypatch.setattr(job_status.time, "sleep", next_poll)
    code, out, err = hpctl("job", "logs", name, "--follow")

    assert code == 0, err
    assert out.splitlines() == [
        "[algo-1] == train: COMPLETED",
        "[algo-2] step 5/30 | loss 1.0000 |",
        "[algo-1] == generate: COMPLETED",
        f"== {name} is Completed",
    ]
    assert polls == [10.0]


def test_stop_refuses_a_finished_job_and_stops_a_running_one(jobs_stack, requests_sent, hpctl):
    submit_tiny(jobs_stack, hpctl)
    name = requests_sent[0]["TrainingJobName"]
    code, _, err = hpctl("job", "stop", name)
    assert code == 2 and f"training job {name} is Completed: there is nothing to stop" in err
    # moto has no StopTrainingJob: a stubbed client checks the request for a running job.
    sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs[name].training_job_status = "InProgress"
    client = FIXTURE_SESSION.client("sagemaker")
    running = client.describe_training_job(TrainingJobName=name)
    stubber = Stubber(client)
    stubber.add_response("describe_training_job", running, {"TrainingJobName": name})
    stubber.add_response("stop_training_job", {}, {"TrainingJobName": name})
    with stubber:
        assert stop_job(client, name).startswith(f"stopping {name} (was InProgress)")
    stubber.assert_no_pending_responses()


def test_cluster_commands_on_a_jobs_only_stack_point_to_hpctl_job(jobs_stack, hpctl):
    code, _, err = hpctl("status")
    assert code == 2 and "is a jobs-only deploy (cdk.json lanes = jobs): it has no cluster" in err
