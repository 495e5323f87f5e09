"""Names every deployable agrees on: the CDK stack (stacks/), the operations CLI (hpctl/) and tools/.

The stack creates what these names point at (outputs, bucket prefixes, the facts file, FSx folders,
instance groups); hpctl and the rehearsal find them by the same names. Standard library only: hpctl
runs on the user's Python 3.10+. Packaged with hpctl (pyproject.toml).

lifecycle/node_facts.py ships to the nodes alone and keeps its own copy of FACT_KEYS;
tests/lifecycle/test_lifecycle_files.py keeps that copy equal to this one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DEFAULT_STACK_NAME = "HyperPodLlamaLora"

# Instance groups. HyperPod names SSM targets and log streams after them.
CONTROLLER_GROUP = "controller"
LOGIN_GROUP = "login"
# Compute groups are configured (cdk.json compute_groups); the facts and outputs name them.
DEFAULT_USER = "ubuntu"  # the AMI's login user; HyperPod shares its home and SSH keys across nodes

# Shared file system layout (FSx for Lustre, mounted on every node). The folders linked to the
# bucket use their own name as S3 prefix (payloads/, datasets/, outputs/).
FSX_MOUNT_PATH = "/fsx"
PAYLOADS_FOLDER = "payloads"  # also the repo folder the stack uploads
DATASETS_FOLDER = "datasets"
OUTPUTS_FOLDER = "outputs"
MODELS_FOLDER = "models"
COMPILE_CACHE_FOLDER = "neuron-cache"
IMAGES_FOLDER = "images"
SCRATCH_FOLDER = "scratch"
# The cluster facts that name each folder (each reaches the nodes as HPL_<KEY>).
FSX_FOLDER_FACTS = {
    "payloads_dir": PAYLOADS_FOLDER,
    "datasets_dir": DATASETS_FOLDER,
    "outputs_dir": OUTPUTS_FOLDER,
    "models_dir": MODELS_FOLDER,
    "compile_cache_dir": COMPILE_CACHE_FOLDER,
    "images_dir": IMAGES_FOLDER,
    "scratch_dir": SCRATCH_FOLDER,
}


def fsx_dir(folder: str) -> str:
    """Where a shared folder is on every node."""
    return f"{FSX_MOUNT_PATH}/{folder}"


def cluster_folders_env() -> dict[str, str]:
    """HPL_<KEY> for every shared folder, with the cluster's values (what an offline preview or dry run shows)."""
    return {f"HPL_{key.upper()}": fsx_dir(folder) for key, folder in FSX_FOLDER_FACTS.items()}


def s3_prefix(folder: str) -> str:
    """The bucket prefix a linked folder is imported from (and exported to)."""
    return f"{folder}/"


# Run configs `hpctl submit` sends without a deploy: s3://<bucket>/payloads/run-configs/, which FSx imports
# beside configs/ (same depth: relative paths in a config resolve alike); a deploy's prune leaves it alone.
RUN_CONFIGS_FOLDER = "run-configs"
# The code only a deploy ships (a config upload cannot): its digest is written beside it, so hpctl can
# tell when the cluster runs older code than the checkout.
PAYLOAD_CODE_FOLDERS = ("llm_pipeline", "slurm")
PAYLOAD_CODE_DIGEST_FILE = "payload-code.sha256"


def payload_code_digest(payloads_dir: Path) -> str:
    """sha256 over the payload code's relative paths and bytes (interpreter caches left out)."""
    digest = hashlib.sha256()
    for folder in PAYLOAD_CODE_FOLDERS:
        for path in sorted((payloads_dir / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(payloads_dir).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# Lifecycle upload: s3://<bucket>/lifecycle/ holds the script HyperPod runs once Slurm is up and
# the facts file the stack generates for it.
LIFECYCLE_PREFIX = "lifecycle"
CLUSTER_FACTS_FILE = "cluster-facts.json"
CLUSTER_FACTS_KEY = f"{LIFECYCLE_PREFIX}/{CLUSTER_FACTS_FILE}"
# The keys of cluster-facts.json; every node exports each as HPL_<KEY>.
FACT_KEYS = (
    "cluster_name",
    "region",
    "bucket",
    "image_uri",
    "fsx_mount_path",
    *FSX_FOLDER_FACTS,
    "controller_group",
    "login_group",
    "compute_groups",
    "compute_group",
    "partition",
    "default_partition",
    "default_user",
    "accelerator",
    "devices_per_node",
    "efa_interfaces",
    "efa_device_rdma",
    "compute_instance_type",
    "runtime",
    "observability",
    "metrics_remote_write_url",
    "metrics_textfile_path",
    "node_exporter_image",
    "collector_image",
    "dcgm_exporter_image",
    "hf_token_secret_arn",
    "alerts_topic_arn",
    "alert_stall_minutes",
    "partitions",
)
# The Hugging Face token's secret (stacks/secrets.py): its ARN is a plain fact (HPL_HF_TOKEN_SECRET_ARN on
# the nodes, the job's environment in the jobs lane); the token itself is the JSON field below, read at run time.
HUB_TOKEN_SECRET_VARIABLE = "HPL_HF_TOKEN_SECRET_ARN"
HUB_TOKEN_FIELD = "token"


class StackOutput:
    """Logical ids of the stack's CloudFormation outputs: the contract hpctl starts from (never rename)."""

    CLUSTER_NAME = "ClusterName"
    CLUSTER_ARN = "ClusterArn"
    CLUSTER_ID = "ClusterId"
    BUCKET_NAME = "BucketName"
    FSX_FILE_SYSTEM_ID = "FsxFileSystemId"
    FSX_DNS_NAME = "FsxDnsName"
    FSX_MOUNT_NAME = "FsxMountName"
    IMAGE_URI = "ImageUri"
    REGION = "Region"
    CONTROLLER_GROUP = "ControllerGroup"
    COMPUTE_GROUP = "ComputeGroup"
    SHELL_COMMAND = "ShellCommand"
    SUBMIT_COMMAND = "SubmitCommand"
    HF_TOKEN_SECRET_ARN = "HfTokenSecretArn"  # both lanes: where `hpctl secret set hf-token` writes

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(value for key, value in vars(cls).items() if key.isupper())


class JobStackOutput:
    """Outputs of the jobs lane (cdk.json `lanes`: jobs or both): what `hpctl job submit` reads."""

    JOB_ROLE_ARN = "JobRoleArn"
    NEURON_IMAGE_URI = "NeuronImageUri"
    CUDA_IMAGE_URI = "CudaImageUri"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(value for key, value in vars(cls).items() if key.isupper())


# Bucket prefixes of the jobs lane: the job execution role reads the inputs and writes the rest.
JOBS_FOLDER = "jobs"  # s3://<bucket>/jobs/<run>/: staged code, model.tar.gz, TensorBoard
JOB_INPUT_PREFIXES = (MODELS_FOLDER, DATASETS_FOLDER)  # channels models/<model>/ and datasets/<run>/
# the run folder (checkpoint sync), job artifacts, and the Neuron compile cache every job of the stack shares
JOB_OUTPUT_PREFIXES = (OUTPUTS_FOLDER, JOBS_FOLDER, COMPILE_CACHE_FOLDER)
JOB_LOG_GROUP = "/aws/sagemaker/TrainingJobs"  # SageMaker's own, account-wide


# Observability (stacks/observability.py, lifecycle/observability.sh, hpctl metrics): what the
# `observability` config key may be, and where a run's own metrics meet node exporter on a node.
PROMETHEUS_MODE = "prometheus"  # the stack's AMP workspace and exporters
MANAGED_MODE = "managed"  # AWS's sagemaker-observability cluster extension
OFF_MODE = "off"
OBSERVABILITY_MODES = (PROMETHEUS_MODE, MANAGED_MODE, OFF_MODE)
MANAGED_EXTENSION = "sagemaker-observability"
METRICS_TEXTFILE_DIR = "/var/lib/hyperpod-lora/metrics"  # node exporter's textfile collector reads *.prom here


class ObservabilityOutput:
    """How the cluster is watched (cluster lane): the mode always, the AMP endpoint in prometheus mode."""

    MODE = "Observability"
    METRICS_ENDPOINT = (
        "MetricsEndpoint"  # the workspace's prometheusEndpoint (https://aps-workspaces.../workspaces/ws-.../)
    )


# Paths under an AMP workspace's prometheusEndpoint (which ends in a slash).
REMOTE_WRITE_PATH = "api/v1/remote_write"
QUERY_PATH = "api/v1/query"


JSII_NODE_MAJORS = (22, 24)  # the CDK library's jsii runtime supports these
CDK_CLI_MIN_NODE = 18  # the CDK CLI pinned in package.json runs from this major on


def node_verdict(major: int) -> tuple[bool, str]:
    """(whether the CDK runs on Node.js ``major``, what to tell the user or ""): make's note and hpctl doctor."""
    supported = " and ".join(str(known) for known in JSII_NODE_MAJORS)
    wanted = " or ".join(str(known) for known in JSII_NODE_MAJORS)
    if major < CDK_CLI_MIN_NODE:
        return (
            False,
            f"Node.js {major} is too old for the CDK CLI (it needs {CDK_CLI_MIN_NODE} or later): install {wanted}",
        )
    if major not in JSII_NODE_MAJORS:
        return True, (
            f"Node.js {major} is outside the CDK's jsii support (Node.js {supported} are supported); it still runs "
            "here: move to one of them when you can"
        )
    return True, ""
