"""Observability: an Amazon Managed Prometheus workspace and the exporter images the nodes run.

Mode ``prometheus`` (the default): the stack owns one AMP workspace (deleted with the stack), the
node role may only remote-write into it, and every exporter image comes from the stack's own ECR
assets repository: each is a one-line Dockerfile ``FROM`` an upstream image pinned by digest, so a
node never pulls from a public registry and a pin moves only with this file. The lifecycle script
runs them by node role and accelerator (lifecycle/observability.sh). Mode ``managed`` installs
AWS's ``sagemaker-observability`` cluster extension after the deploy (``hpctl observability
enable``: neither aws-cdk-lib 2.275 nor cfn-lint 1.58 knows ``AWS::SageMaker::Extension``, while
botocore's model has CreateClusterExtension, so its parameters are checked against AWS's own model).
Mode ``off``: nothing.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode, RemovalPolicy
from aws_cdk import aws_aps as aps
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

from cluster_contract import REMOTE_WRITE_PATH

# Upstream images, pinned by digest (the tag is for people; Docker pulls the digest). Digests as
# published for these tags by the projects' registries; check one with
# `docker buildx imagetools inspect <ref>` before moving a pin.
NODE_EXPORTER = "node_exporter"
COLLECTOR = "prometheus"  # Prometheus in agent mode: scrapes the exporters, remote-writes with SigV4
DCGM_EXPORTER = "dcgm_exporter"
UPSTREAM_IMAGES = {
    NODE_EXPORTER: "quay.io/prometheus/node-exporter:v1.9.1"
    "@sha256:d00a542e409ee618a4edc67da14dd48c5da66726bbd5537ab2af9c1dfc442c8a",
    COLLECTOR: "quay.io/prometheus/prometheus:v3.5.0"
    "@sha256:63805ebb8d2b3920190daf1cb14a60871b16fd38bed42b857a3182bc621f4996",
    DCGM_EXPORTER: "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-ubuntu22.04"
    "@sha256:b4df763de9558e5b3f1f1d79bc65b772fcf65b8a9c3664ea7173e47153112b4a",
}
UPSTREAM_BUILD_ARG = "UPSTREAM"  # observability/image/Dockerfile: ARG UPSTREAM, FROM ${UPSTREAM}


def exporter_names(*, with_cuda: bool) -> tuple[str, ...]:
    """The images a cluster needs: DCGM's only where a compute group has GPUs."""
    return (NODE_EXPORTER, COLLECTOR, *((DCGM_EXPORTER,) if with_cuda else ()))


class MetricsWorkspace(Construct):
    """One AMP workspace, the exporter images, and the node role's right to write into that workspace only."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        alias: str,
        image_dir: Path,
        with_cuda: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        self.workspace = aps.CfnWorkspace(self, "Workspace", alias=alias)
        self.workspace.apply_removal_policy(RemovalPolicy.DESTROY)  # metrics go with the cluster they describe
        self.images = {
            name: ecr_assets.DockerImageAsset(
                self,
                f"{name.title().replace('_', '')}Image",
                directory=str(image_dir),
                build_args={UPSTREAM_BUILD_ARG: UPSTREAM_IMAGES[name]},
                ignore_mode=IgnoreMode.DOCKER,
                platform=ecr_assets.Platform.LINUX_AMD64,
                display_name=f"exporter-{name.replace('_', '-')}",
            )
            for name in exporter_names(with_cuda=with_cuda)
        }

    @property
    def remote_write_url(self) -> str:
        return f"{self.workspace.attr_prometheus_endpoint}{REMOTE_WRITE_PATH}"

    @property
    def image_uris(self) -> dict[str, str]:
        return {name: image.image_uri for name, image in self.images.items()}

    def remote_write_statement(self) -> iam.PolicyStatement:
        """aps:RemoteWrite on this workspace's ARN, nothing else: nodes cannot read or write other workspaces."""
        return iam.PolicyStatement(
            sid="RemoteWriteMetrics", actions=["aps:RemoteWrite"], resources=[self.workspace.attr_arn]
        )
