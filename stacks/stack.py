"""The one stack: composes the constructs in deploy order; no resources of its own."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Environment, Stack, Tags
from constructs import Construct

from cluster_contract import PROMETHEUS_MODE
from stacks.accelerators import CUDA, NEURON, TORCHNEURON
from stacks.accounting_database import AccountingDatabase
from stacks.alerts import AlertsTopic
from stacks.checkov_skips import skip_cdk_handler_findings
from stacks.cluster import ControllerAccess, HyperPodCluster
from stacks.config import ACCOUNTING_EXTERNAL, HyperPodConfig, cluster_facts, observability_facts
from stacks.handler_logs import attach_provider_log_groups
from stacks.iam import ClusterRole, scaler_grant
from stacks.image import lane_images, serving_images
from stacks.jobs import JobRole
from stacks.lifecycle import LifecycleUpload
from stacks.nag import acknowledge_cdk_providers
from stacks.network import Network, pin_availability_zone
from stacks.observability import MetricsWorkspace
from stacks.outputs import add_job_outputs, add_observability_outputs, add_outputs, add_secret_outputs
from stacks.payloads import PayloadUpload, deploy_facts
from stacks.secrets import HubTokenSecret
from stacks.storage import DataBucket, SharedFileSystem
from stacks.teams import users_file
from stacks.update_safety import CONFIG_METADATA_KEY, config_record


def stack_description(config: HyperPodConfig) -> str:
    names = {NEURON: "Trainium", TORCHNEURON: "Trainium2", CUDA: "GPU"}
    on = " and ".join(names[family] for family in config.image_families)
    what = {
        "cluster": "SageMaker HyperPod Slurm cluster",
        "jobs": "SageMaker training jobs (no cluster)",
        "both": "SageMaker HyperPod Slurm cluster and training jobs",
    }[config.lanes]
    return f"{what} on {on} for Llama fine-tuning (LoRA, DoRA, QLoRA, full) and pretraining"


class HyperPodStack(Stack):
    """Bucket and images, then each lane the config asks for: the HyperPod cluster (network, FSx, node
    role, uploads, cluster) and/or the training-job execution role."""

    def __init__(self, scope: Construct, construct_id: str, *, config: HyperPodConfig, source_root: Path) -> None:
        super().__init__(
            scope,
            construct_id,
            stack_name=config.stack_name,
            env=Environment(account=config.account, region=config.region),
            description=stack_description(config),
            analytics_reporting=False,
        )
        self.config = config
        # The config it was made from, for `make deploy` to compare with (stacks/predeploy.py).
        self.template_options.metadata = {CONFIG_METADATA_KEY: config_record(config)}
        Tags.of(self).add("project", config.name_prefix)
        if config.cluster_lane:
            pin_availability_zone(self, config.availability_zone_id)  # context: before any child
        self.data = DataBucket(self, "Data", bucket_name=config.bucket_name, retain=config.retain_outputs)
        self.hub_token = HubTokenSecret(self, "HubToken", name_prefix=config.name_prefix)
        lanes = tuple(lane for lane, on in (("cluster", config.cluster_lane), ("jobs", config.jobs_lane)) if on)
        images = lane_images(self, context_dir=source_root / "payloads", families=config.image_families, lanes=lanes)
        self.images = images.get("cluster", {})  # CUDA: the -ec2 base
        # vLLM for the steps that serve on the nodes (benchmark, GRPO's rollouts, hpctl serve); a host runtime
        # runs them from the nodes' own vLLM site instead.
        self.serving_images = {}
        if config.cluster_lane and config.runtime == "pyxis":
            families = tuple(self.images)
            self.serving_images = serving_images(self, context_dir=source_root / "payloads", families=families)
        self.job_images = images.get("jobs", {})  # CUDA: the -sagemaker base
        if config.cluster_lane:
            self._cluster_lane(config, source_root)
        if config.jobs_lane:
            # One CDK assets repository holds every image.
            repository = next(iter(self.job_images.values())).asset.repository
            self.job_role = JobRole(
                self,
                "JobRole",
                name_prefix=config.name_prefix,
                bucket=self.data.bucket,
                image_repository=repository,
                extra_statements=self.hub_token.read_statements(),
            )
            add_job_outputs(
                self,
                config=config,
                role_arn=self.job_role.role.role_arn,
                images=self.job_images,
                data=self.data,
                with_shared=not config.cluster_lane,
            )
        self.hub_token.restrict_reads(self._token_readers())
        add_secret_outputs(self, hub_token_secret_arn=self.hub_token.arn)
        acknowledge_cdk_providers(self, destination=self.data.bucket)
        attach_provider_log_groups(self)
        skip_cdk_handler_findings(self)

    def _token_readers(self) -> list:
        """The roles whose runs download from the Hub: the node role and the job role, where the lanes make them."""
        roles = [getattr(self, "role", None), getattr(self, "job_role", None)]
        return [holder.role for holder in roles if holder is not None]

    def _cluster_lane(self, config: HyperPodConfig, source_root: Path) -> None:
        """Network, FSx, the node role, lifecycle and payload uploads, then the HyperPod cluster."""
        self.network = Network(self, "Network", cidr=config.vpc_cidr, availability_zone_id=config.availability_zone_id)
        security_group = self.network.security_group
        self.file_system = SharedFileSystem(
            self,
            "Fsx",
            subnet=self.network.private_subnet,
            security_group=security_group.group,
            security_group_rules=security_group.rules,
            data_bucket=self.data,
            storage_capacity_gib=config.fsx_storage_capacity_gib,
            throughput_mibps_per_tib=config.fsx_throughput_mibps_per_tib,
            compression=config.fsx_compression,
        )
        self.accounting_database = None
        if config.accounting_database == ACCOUNTING_EXTERNAL:
            self.accounting_database = AccountingDatabase(
                self,
                "AccountingDatabase",
                vpc=self.network.vpc,
                vpc_cidr=config.vpc_cidr,
                cluster_subnet=self.network.private_subnet,
                second_zone_id=config.accounting_database_zone_id,
                retain=config.retain_outputs,
                cluster_name=config.cluster_name,
            )
        image_uris = {family: image.image_uri for family, image in self.images.items()}
        default_image = self.images[config.image_family_of(config.default_group)]
        self.metrics = None
        metrics = observability_facts(config)
        if config.observability == PROMETHEUS_MODE:
            self.metrics = MetricsWorkspace(
                self,
                "Metrics",
                alias=f"{config.cluster_name}-metrics",
                image_dir=source_root / "observability" / "image",
                with_cuda=CUDA in config.image_families,
            )
            metrics = observability_facts(
                config, remote_write_url=self.metrics.remote_write_url, exporter_images=self.metrics.image_uris
            )
        self.alerts = AlertsTopic(self, "Alerts", cluster_name=config.cluster_name, emails=config.alert_emails)
        role_settings = dict(
            cluster_name=config.cluster_name,
            bucket=self.data.bucket,
            image_repository=default_image.asset.repository,  # one CDK assets repository holds every image
            subnet=self.network.private_subnet,
            vpc_id=self.network.vpc.vpc_id,
        )
        metrics_statements = [self.metrics.remote_write_statement()] if self.metrics else []
        database = self.accounting_database
        self.role = ClusterRole(
            self,
            "ClusterRole",
            **role_settings,
            security_groups=[security_group.group],
            extra_statements=[
                *self.hub_token.read_statements(),
                *metrics_statements,
                *self.alerts.publish_statements(),  # the run side publishes its state changes (jobs/alerts.py)
            ],
            groups="login and compute groups" if database else "every group",
        )
        # The sides differ with the external database: the controller alone reads its secret (and downloads
        # nothing from the Hub, nor writes to the bucket), so it runs as a role of its own.
        self.controller_role = self.role
        if database:
            self.controller_role = ClusterRole(
                self,
                "ControllerRole",
                **role_settings,
                security_groups=[security_group.group, database.controller_security_group],
                extra_statements=[*metrics_statements, *database.read_statements()],
                bucket_writes=False,
                groups="the controller group",
            )
        self.facts = facts = cluster_facts(
            config,
            image_uris=image_uris,
            serving_image_uris={family: image.image_uri for family, image in self.serving_images.items()},
            metrics=metrics,
            hf_token_secret_arn=self.hub_token.arn,
            alerts_topic_arn=self.alerts.topic_arn,
        )
        self.lifecycle = LifecycleUpload(
            self,
            "Lifecycle",
            source_dir=source_root / "lifecycle",
            bucket=self.data.bucket,
            facts=facts,
            users=users_file(config.teams, config.users),
        )
        self.payloads = PayloadUpload(
            self,
            "Payloads",
            source_dir=source_root / "payloads",
            bucket=self.data.bucket,
            deploy_facts=deploy_facts(facts),
        )
        self.cluster = HyperPodCluster(
            self,
            "HyperPod",
            config=config,
            role_arn=self.role.role.role_arn,
            subnet_id=self.network.private_subnet.subnet_id,
            security_group_id=security_group.group.security_group_id,
            fsx_dns_name=self.file_system.dns_name,
            fsx_mount_name=self.file_system.mount_name,
            depends_on=[
                self.lifecycle,
                *{self.role, self.controller_role},
                *self.file_system.associations,
                *security_group.rules,
                self.network.private_subnet.internet_connectivity_established,
            ],
            accounting_database=database.cluster_property() if database else None,
            controller=(
                ControllerAccess(
                    role_arn=self.controller_role.role.role_arn,
                    security_group_id=database.controller_security_group.security_group_id,
                )
                if database
                else None
            ),
        )
        if any(group.scale_with_runs for group in config.compute_groups):
            scaler_grant(
                self,
                "CapacityScaling",
                cluster_arn=self.cluster.arn,
                roles=[r.role for r in {self.role, self.controller_role}],
            )
        add_outputs(
            self,
            config=config,
            cluster=self.cluster,
            data=self.data,
            file_system=self.file_system,
            image_uri=default_image.image_uri,
        )
        add_observability_outputs(self, mode=config.observability, workspace=self.metrics)
