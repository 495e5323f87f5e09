"""The stack's outputs: the fixed contract hpctl and users read (logical ids must not change)."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import CfnOutput, Fn, Stack

from cluster_contract import CONTROLLER_GROUP, JobStackOutput, ObservabilityOutput, StackOutput
from stacks.accelerators import CUDA, NEURON
from stacks.cluster import HyperPodCluster
from stacks.config import HyperPodConfig
from stacks.image import TrainingImage
from stacks.observability import MetricsWorkspace
from stacks.storage import DataBucket, SharedFileSystem

DEFAULT_RUN_CONFIG = "default"  # payloads/configs/default.toml


def add_outputs(
    stack: Stack,
    *,
    config: HyperPodConfig,
    cluster: HyperPodCluster,
    data: DataBucket,
    file_system: SharedFileSystem,
    image_uri: str,
) -> None:
    where = f"--stack {config.stack_name} --region {config.region}"
    ssm_target = Fn.join("", ["sagemaker-cluster:", cluster.cluster_id, f"_{CONTROLLER_GROUP}-<instance-id>"])
    values = {
        StackOutput.CLUSTER_NAME: (config.cluster_name, "HyperPod cluster name"),
        StackOutput.CLUSTER_ARN: (cluster.arn, "HyperPod cluster ARN"),
        StackOutput.CLUSTER_ID: (cluster.cluster_id, "HyperPod cluster id (SSM targets and log groups use it)"),
        StackOutput.BUCKET_NAME: (data.bucket.bucket_name, "Data bucket: lifecycle/, payloads/, datasets/, outputs/"),
        StackOutput.FSX_FILE_SYSTEM_ID: (file_system.file_system.ref, "FSx for Lustre file system id"),
        StackOutput.FSX_DNS_NAME: (file_system.dns_name, "FSx for Lustre DNS name"),
        StackOutput.FSX_MOUNT_NAME: (file_system.mount_name, "FSx for Lustre mount name"),
        StackOutput.IMAGE_URI: (image_uri, "Training image in ECR"),
        StackOutput.REGION: (config.region, "Region of the stack"),
        StackOutput.CONTROLLER_GROUP: (CONTROLLER_GROUP, "Slurm controller instance group"),
        StackOutput.COMPUTE_GROUP: (
            ",".join(group.name for group in config.compute_groups),
            "Compute instance groups (one Slurm partition each)",
        ),
        StackOutput.SHELL_COMMAND: (
            Fn.join(
                "",
                [
                    f"hpctl shell {where}   (or: aws ssm start-session --region {config.region} --target ",
                    ssm_target,
                    f"; instance ids: aws sagemaker list-cluster-nodes --region {config.region} "
                    f"--cluster-name {config.cluster_name})",
                ],
            ),
            "Shell on the controller node",
        ),
        StackOutput.SUBMIT_COMMAND: (
            f"hpctl submit {where} --config {DEFAULT_RUN_CONFIG}",
            "Submit the LoRA pipeline as chained Slurm jobs",
        ),
    }
    for logical_id, (value, description) in values.items():
        CfnOutput(stack, logical_id, value=value, description=description)


def add_observability_outputs(stack: Stack, *, mode: str, workspace: MetricsWorkspace | None) -> None:
    """How the cluster is watched (hpctl status, metrics, dashboard read these)."""
    CfnOutput(stack, ObservabilityOutput.MODE, value=mode, description="Observability mode (prometheus|managed|off)")
    if workspace is not None:
        CfnOutput(
            stack,
            ObservabilityOutput.METRICS_ENDPOINT,
            value=workspace.workspace.attr_prometheus_endpoint,
            description="Amazon Managed Prometheus endpoint of the cluster's metrics (query with SigV4)",
        )


JOB_IMAGE_OUTPUTS = {NEURON: JobStackOutput.NEURON_IMAGE_URI, CUDA: JobStackOutput.CUDA_IMAGE_URI}


def add_job_outputs(
    stack: Stack,
    *,
    config: HyperPodConfig,
    role_arn: str,
    images: Mapping[str, TrainingImage],
    data: DataBucket,
    with_shared: bool,
) -> None:
    """The jobs lane's outputs: the execution role and one image per accelerator family (what
    `hpctl job submit` reads; the CUDA one is built on the -sagemaker DLC variant, not the cluster's
    -ec2 image); the bucket and region too when no cluster lane outputs them."""
    values = {JobStackOutput.JOB_ROLE_ARN: (role_arn, "Execution role of the SageMaker training jobs")}
    for family, image in images.items():
        base = f" (on AWS's -{image.variant} PyTorch training image)" if image.variant else ""
        values[JOB_IMAGE_OUTPUTS[family]] = (image.image_uri, f"Training image for {family} instances in ECR{base}")
    if with_shared:
        values[StackOutput.BUCKET_NAME] = (
            data.bucket.bucket_name,
            "Data bucket: models/, datasets/ (job inputs), outputs/ (run folders), jobs/ (code, artifacts)",
        )
        values[StackOutput.REGION] = (config.region, "Region of the stack")
    for logical_id, (value, description) in values.items():
        CfnOutput(stack, logical_id, value=value, description=description)


def add_secret_outputs(stack: Stack, *, hub_token_secret_arn: str) -> None:
    """Where `hpctl secret set hf-token` puts the Hugging Face token (both lanes)."""
    CfnOutput(
        stack,
        StackOutput.HF_TOKEN_SECRET_ARN,
        value=hub_token_secret_arn,
        description="Secrets Manager secret holding the Hugging Face token (hpctl secret set hf-token)",
    )
