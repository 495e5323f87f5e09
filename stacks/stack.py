"""The one stack: composes the constructs in deploy order; no resources of its own."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Environment, Stack, Tags
from constructs import Construct

from stacks.cluster import HyperPodCluster
from stacks.config import HyperPodConfig, cluster_facts
from stacks.iam import ClusterRole
from stacks.image import TrainingImage
from stacks.lifecycle import LifecycleUpload
from stacks.nag import acknowledge_cdk_providers
from stacks.network import Network
from stacks.outputs import add_outputs
from stacks.payloads import PayloadUpload
from stacks.storage import DataBucket, SharedFileSystem


class HyperPodStack(Stack):
    """Network, storage, image, role, uploads, then the HyperPod cluster that needs them all."""

    def __init__(self, scope: Construct, construct_id: str, *, config: HyperPodConfig, source_root: Path) -> None:
        super().__init__(
            scope,
            construct_id,
            stack_name=config.stack_name,
            env=Environment(account=config.account, region=config.region),
            description="SageMaker HyperPod Slurm cluster on Trainium for Llama 3 LoRA fine-tuning",
            analytics_reporting=False,
        )
        Tags.of(self).add("project", config.name_prefix)
        network = Network(self, "Network", cidr=config.vpc_cidr, availability_zone=config.availability_zone)
        data = DataBucket(self, "Data", bucket_name=config.bucket_name, retain=config.retain_outputs)
        file_system = SharedFileSystem(
            self,
            "Fsx",
            subnet=network.private_subnet,
            security_group=network.security_group.group,
            security_group_rules=network.security_group.rules,
            data_bucket=data,
            storage_capacity_gib=config.fsx_storage_capacity_gib,
            throughput_mibps_per_tib=config.fsx_throughput_mibps_per_tib,
            compression=config.fsx_compression,
        )
        image = TrainingImage(self, "TrainingImage", context_dir=source_root / "payloads")
        role = ClusterRole(
            self,
            "ClusterRole",
            cluster_name=config.cluster_name,
            bucket=data.bucket,
            image_repository=image.asset.repository,
            subnet=network.private_subnet,
            security_group=network.security_group.group,
        )
        lifecycle = LifecycleUpload(
            self,
            "Lifecycle",
            source_dir=source_root / "lifecycle",
            bucket=data.bucket,
            facts=cluster_facts(config, image_uri=image.image_uri),
        )
        PayloadUpload(self, "Payloads", source_dir=source_root / "payloads", bucket=data.bucket)
        cluster = HyperPodCluster(
            self,
            "HyperPod",
            config=config,
            role_arn=role.role.role_arn,
            subnet_id=network.private_subnet.subnet_id,
            security_group_id=network.security_group.group.security_group_id,
            fsx_dns_name=file_system.dns_name,
            fsx_mount_name=file_system.mount_name,
            depends_on=[
                lifecycle,
                role,
                *file_system.associations,
                *network.security_group.rules,
                network.private_subnet.internet_connectivity_established,
            ],
        )
        add_outputs(self, config=config, cluster=cluster, data=data, file_system=file_system,
                    image_uri=image.image_uri)
        acknowledge_cdk_providers(self, destination=data.bucket)
