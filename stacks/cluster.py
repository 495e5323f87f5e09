"""Cluster: the HyperPod Slurm cluster, configured through the API (no provisioning_parameters.json)."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Fn, RemovalPolicy
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct, IDependable

from cluster_contract import CONTROLLER_GROUP, FSX_MOUNT_PATH, LOGIN_GROUP
from stacks import ami_updates
from stacks.compute_groups import SPOT, ComputeGroup
from stacks.config import CONTINUOUS, LIFECYCLE_SCRIPT, STANDARD, HyperPodConfig

Cfn = sagemaker.CfnCluster
# Continuous provisioning (config key provisioning, the default) is set at create, so
# stacks/update_safety.py refuses a switch. botocore's CreateCluster text still calls the mode EKS-only;
# the HyperPod Slurm guide documents it for Slurm clusters ("Continuous provisioning for enhanced cluster
# operations with Slurm", sagemaker-hyperpod-scaling-slurm.html, which also says it refuses any
# SlurmConfigStrategy), and the CloudFormation schema accepts it with a Slurm orchestrator (cfn-lint passes).
CONTINUOUS_PROVISIONING = "Continuous"


def node_provisioning_mode(config: HyperPodConfig) -> str | None:
    """Continuous, or HyperPod's standard mode (the property left out)."""
    return CONTINUOUS_PROVISIONING if config.provisioning == CONTINUOUS else None


def slurm_orchestrator(
    config: HyperPodConfig, accounting_database: Cfn.ClusterAccountingDatabaseProperty | None = None
) -> Cfn.OrchestratorProperty:
    """Slurm, with the strategy set explicitly in standard mode (the docs disagree on its default,
    Managed vs Merge); continuous mode takes none (it runs in merge mode and refuses the field).
    ``accounting_database``: the external one (stacks/accounting_database.py), else HyperPod's on the controller."""
    strategy = config.slurm_config_strategy if config.provisioning == STANDARD else None
    return Cfn.OrchestratorProperty(
        slurm=Cfn.ClusterOrchestratorSlurmConfigProperty(
            slurm_config_strategy=strategy, accounting_database=accounting_database
        )
    )


def capacity_properties(group: ComputeGroup) -> dict[str, object]:
    """Where a group's nodes come from. On-demand is HyperPod's default when CapacityRequirements is
    absent, so only Spot is written, and a training plan (reserved capacity) is named by its ARN.
    MinInstanceCount (continuous mode only) is written when set: 0 is HyperPod's default for compute."""
    properties: dict[str, object] = {}
    if group.min_instance_count:
        properties["min_instance_count"] = group.min_instance_count
    if group.capacity == SPOT:
        properties["capacity_requirements"] = Cfn.ClusterCapacityRequirementsProperty(spot={})
    if group.training_plan_arn:
        properties["training_plan_arn"] = group.training_plan_arn
    if group.deep_health_checks:
        properties["on_start_deep_health_checks"] = list(group.deep_health_checks)
    return properties


def deployment_config() -> Cfn.DeploymentConfigProperty:
    rolling = ami_updates.ROLLING_DEPLOYMENT
    batch = rolling["RollingUpdatePolicy"]["MaximumBatchSize"]
    return Cfn.DeploymentConfigProperty(
        rolling_update_policy=Cfn.RollingUpdatePolicyProperty(
            maximum_batch_size=Cfn.CapacitySizeConfigProperty(type=batch["Type"], value=batch["Value"])
        ),
        wait_interval_in_seconds=rolling["WaitIntervalInSeconds"],
    )


def ami_update_properties(auto_patch: str, scheduled_update: str) -> dict[str, object]:
    """The group's AutoPatchConfig and ScheduledUpdateConfig, each only when set; both roll one node at a time."""
    properties: dict[str, object] = {}
    if auto_patch:
        properties["auto_patch_config"] = Cfn.AutoPatchConfigProperty(
            patching_strategy=auto_patch, deployment_config=deployment_config()
        )
    if scheduled_update:
        properties["scheduled_update_config"] = Cfn.ScheduledUpdateConfigProperty(
            schedule_expression=scheduled_update, deployment_config=deployment_config()
        )
    return properties


@dataclass(frozen=True)
class ControllerAccess:
    """Where the controller's side differs from the other nodes' (stacks/iam.py: the accounting database):
    its own execution role, and a security group of its own beside the cluster's, which the database admits.
    HyperPod gives a group its own VPC settings through OverrideVpcConfig (same subnet here)."""

    role_arn: str
    security_group_id: str


class HyperPodCluster(Construct):
    """Controller + (optional login) + the configured compute groups, FSx at /fsx on every node.

    HyperPod sets up Slurm, Docker/Enroot/Pyxis and the FSx mount itself; our lifecycle script
    runs after that (OnInitComplete) on every node. ``depends_on`` lists what must exist first:
    the lifecycle upload, the role's policies, the FSx folder links and the NAT route.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: HyperPodConfig,
        role_arn: str,
        subnet_id: str,
        security_group_id: str,
        fsx_dns_name: str,
        fsx_mount_name: str,
        depends_on: list[IDependable],
        accounting_database: Cfn.ClusterAccountingDatabaseProperty | None = None,
        controller: ControllerAccess | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        fsx_storage = Cfn.ClusterInstanceStorageConfigProperty(
            fsx_lustre_config=Cfn.ClusterFsxLustreConfigProperty(
                dns_name=fsx_dns_name, mount_name=fsx_mount_name, mount_path=FSX_MOUNT_PATH
            )
        )
        lifecycle = Cfn.ClusterLifeCycleConfigProperty(
            source_s3_uri=config.lifecycle_s3_uri, on_init_complete=LIFECYCLE_SCRIPT
        )

        def group(
            name: str,
            node_type: str,
            instance_type: str | None,
            count: int,
            *,
            threads_per_core: int = 1,
            storage: tuple = (),
            partition: str | None = None,
            execution_role: str = role_arn,
            **extra: object,
        ) -> Cfn.ClusterInstanceGroupProperty:
            return Cfn.ClusterInstanceGroupProperty(
                instance_group_name=name,
                instance_type=instance_type,
                instance_count=count,
                execution_role=execution_role,
                threads_per_core=threads_per_core,
                life_cycle_config=lifecycle,
                instance_storage_configs=[*storage, fsx_storage],
                slurm_config=Cfn.ClusterSlurmConfigProperty(
                    node_type=node_type, partition_names=[partition] if partition else None
                ),
                **extra,
            )

        controller_extra = (
            {
                "execution_role": controller.role_arn,
                "override_vpc_config": Cfn.VpcConfigProperty(
                    security_group_ids=[security_group_id, controller.security_group_id], subnets=[subnet_id]
                ),
            }
            if controller
            else {}
        )
        groups = [
            group(
                CONTROLLER_GROUP,
                "Controller",
                config.controller_instance_type,
                config.controller_instance_count,
                **controller_extra,
            )
        ]
        if config.login_instance_count:
            groups.append(group(LOGIN_GROUP, "Login", config.login_instance_type, config.login_instance_count))
        for compute in config.compute_groups:
            groups.append(
                group(
                    compute.name,
                    "Compute",
                    None if compute.instance_types else compute.instance_type,
                    compute.deployed_count,
                    threads_per_core=compute.threads_per_core,
                    storage=(
                        Cfn.ClusterInstanceStorageConfigProperty(
                            ebs_volume_config=Cfn.ClusterEbsVolumeConfigProperty(
                                volume_size_in_gb=compute.ebs_volume_gb
                            )
                        ),
                    ),
                    partition=compute.partition,
                    **flexible_types(compute),
                    **capacity_properties(compute),
                    **ami_update_properties(compute.auto_patch, compute.scheduled_update),
                )
            )
        self.cluster = Cfn(
            self,
            "Cluster",
            cluster_name=config.cluster_name,
            instance_groups=groups,
            orchestrator=slurm_orchestrator(config, accounting_database),
            node_recovery=config.node_recovery,
            node_provisioning_mode=node_provisioning_mode(config),
            vpc_config=Cfn.VpcConfigProperty(security_group_ids=[security_group_id], subnets=[subnet_id]),
        )
        self.cluster.apply_removal_policy(RemovalPolicy.DESTROY)
        for dependency in depends_on:
            self.cluster.node.add_dependency(dependency)

    @property
    def arn(self) -> str:
        return self.cluster.attr_cluster_arn

    @property
    def cluster_id(self) -> str:
        """The last segment of the ARN: what SSM targets and log groups are named after."""
        return Fn.select(1, Fn.split("/", self.cluster.attr_cluster_arn))


def flexible_types(group: ComputeGroup) -> dict[str, object]:
    """A flexible group names its types in priority order (InstanceRequirements) instead of one InstanceType."""
    if not group.instance_types:
        return {}
    return {"instance_requirements": Cfn.InstanceRequirementsProperty(instance_types=list(group.instance_types))}
