"""The HyperPod cluster as the SageMaker API reports it, and the choice of the node to talk to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import boto3
from botocore.exceptions import ClientError

from hpctl.common.errors import HpctlError, aws_errors


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    current: int
    target: int
    capacity: str = "on-demand"  # on-demand or spot (CapacityRequirements; absent means on-demand)
    training_plan_arn: str = ""
    training_plan_status: str = ""
    minimum: int = 0  # MinCount (continuous provisioning): in service with this many; 0: the target
    partitions: tuple[str, ...] = ()  # SlurmConfig.PartitionNames: the Slurm partitions its nodes serve
    image_release: str = ""  # CurrentImageReleaseVersion: the HyperPod AMI release its nodes run
    desired_image_release: str = ""  # DesiredImageReleaseVersion: differs while an update rolls out
    image_status: str = ""  # ImageVersionStatus: UpToDate, UpdateAvailable, SecurityUpdateRequired, EndOfLife

    @property
    def needed(self) -> int:
        """Nodes the group needs before `hpctl wait` calls it ready: its minimum, else its target."""
        return self.minimum or self.target

    @property
    def ready(self) -> bool:
        return self.current >= self.needed

    def progress(self) -> str:
        return f"{self.name} {self.current}/{self.target}" + (f" (min {self.minimum})" if self.minimum else "")

    @property
    def training_plan(self) -> str:
        """The plan's name (the ARN's last segment) and status, or "-"."""
        if not self.training_plan_arn:
            return "-"
        name = self.training_plan_arn.rsplit("/", 1)[-1]
        return f"{name} ({self.training_plan_status})" if self.training_plan_status else name


@dataclass(frozen=True)
class Node:
    group: str
    instance_id: str
    instance_type: str
    status: str  # Running, Pending, Failure, ShuttingDown, SystemUpdating, ...
    message: str
    launch_time: datetime | None
    hostname: str = ""  # PrivateDnsHostname (ip-10-1-2-3.<region>.compute.internal): Slurm uses its first label
    logical_id: str = ""  # NodeLogicalId (continuous provisioning): the node's id from request to termination

    @property
    def slurm_name(self) -> str:
        return self.hostname.split(".", 1)[0]


@dataclass(frozen=True)
class ClusterState:
    name: str
    arn: str
    status: str  # Creating, InService, Updating, Failed, Deleting, ...
    failure_message: str
    groups: tuple[InstanceGroup, ...]
    provisioning: str = "standard"  # continuous when NodeProvisioningMode is Continuous

    @property
    def continuous(self) -> bool:
        return self.provisioning == "continuous"

    @property
    def filling(self) -> tuple[InstanceGroup, ...]:
        """Groups still short of what they need (continuous mode is InService before nodes arrive)."""
        return tuple(group for group in self.groups if not group.ready)

    @property
    def cluster_id(self) -> str:
        """The id SSM targets use: the last segment of the ARN (…:cluster/<id>)."""
        return self.arn.rsplit("/", 1)[-1]


class ClusterNotFound(HpctlError):
    """No cluster of that name in the region (never created, rolled back, or deleted)."""


def describe_cluster(session: boto3.Session, name: str) -> ClusterState:
    with aws_errors(f"describe cluster {name}"):
        try:
            reply = session.client("sagemaker").describe_cluster(ClusterName=name)
        except ClientError as error:
            if not _is_not_found(error):
                raise
            raise ClusterNotFound(
                f"cluster {name} named by the stack does not exist in {session.region_name}: "
                "was it deleted outside CloudFormation? `make deploy` recreates it"
            ) from error
    return ClusterState(
        name=reply["ClusterName"],
        arn=reply["ClusterArn"],
        status=reply["ClusterStatus"],
        failure_message=reply.get("FailureMessage", ""),
        groups=tuple(
            InstanceGroup(
                name=group["InstanceGroupName"],
                instance_type=group.get("InstanceType", ""),
                current=group.get("CurrentCount", 0),
                target=group.get("TargetCount", 0),
                capacity="spot" if "Spot" in group.get("CapacityRequirements", {}) else "on-demand",
                training_plan_arn=group.get("TrainingPlanArn", ""),
                training_plan_status=group.get("TrainingPlanStatus", ""),
                minimum=group.get("MinCount", 0),
                partitions=tuple(group.get("SlurmConfig", {}).get("PartitionNames", ())),
                image_release=group.get("CurrentImageReleaseVersion", ""),
                desired_image_release=group.get("DesiredImageReleaseVersion", ""),
                image_status=group.get("ImageVersionStatus", ""),
            )
            for group in reply.get("InstanceGroups", [])
        ),
        provisioning="continuous" if reply.get("NodeProvisioningMode") == "Continuous" else "standard",
    )


def _is_not_found(error: ClientError) -> bool:
    """The service answers ResourceNotFound; moto a ValidationException saying "Could not find"."""
    details = error.response.get("Error", {})
    return details.get("Code") == "ResourceNotFound" or "could not find" in details.get("Message", "").lower()


def list_nodes(session: boto3.Session, name: str, *, logical_ids: bool = False) -> list[Node]:
    """The cluster's nodes; ``logical_ids`` (continuous provisioning only) adds each node's NodeLogicalId."""
    paginator = session.client("sagemaker").get_paginator("list_cluster_nodes")
    nodes = []
    extra = {"IncludeNodeLogicalIds": True} if logical_ids else {}
    with aws_errors(f"list the nodes of cluster {name}"):
        for page in paginator.paginate(ClusterName=name, **extra):
            for summary in page["ClusterNodeSummaries"]:
                status = summary.get("InstanceStatus", {})
                nodes.append(
                    Node(
                        group=summary["InstanceGroupName"],
                        instance_id=summary["InstanceId"],
                        instance_type=summary.get("InstanceType", ""),
                        status=status.get("Status", ""),
                        message=status.get("Message", ""),
                        launch_time=summary.get("LaunchTime"),
                        hostname=summary.get("PrivateDnsHostname", ""),
                        logical_id=summary.get("NodeLogicalId", ""),
                    )
                )
    return sorted(nodes, key=lambda node: (node.group, node.instance_id))


READY_STATES = ("InService", "Updating", "SystemUpdating")


def require_usable(cluster: ClusterState, *, ready: bool) -> None:
    """Stop when the cluster cannot take a session (failed, going away), or, with ``ready``, is not in service."""
    if cluster.status == "Failed":
        raise HpctlError(f"cluster {cluster.name} failed: {cluster.failure_message or 'no reason given'}")
    if cluster.status == "Deleting":
        raise HpctlError(f"cluster {cluster.name} is being deleted")
    if ready and cluster.status not in READY_STATES:
        raise HpctlError(f"cluster {cluster.name} is {cluster.status}: `hpctl wait` follows it until it is in service")


def choose_node(nodes: list[Node], *, cluster: str, group: str, instance_id: str | None) -> Node:
    """The node named by ``instance_id``, else the first running node of ``group``."""
    if instance_id:
        for node in nodes:
            if node.instance_id == instance_id:
                return node
        known = ", ".join(node.instance_id for node in nodes) or "none"
        raise HpctlError(f"node {instance_id} is not in cluster {cluster} (nodes: {known}); see `hpctl status`")
    members = [node for node in nodes if node.group == group]
    if not members:
        groups = sorted({node.group for node in nodes})
        present = f" (groups with nodes: {', '.join(groups)})" if groups else ""
        raise HpctlError(
            f"no nodes yet in group {group} of cluster {cluster}{present}: "
            "wait until they are running (`hpctl wait`, `hpctl status`)"
        )
    running = [node for node in members if node.status == "Running"]
    return (running or members)[0]


def ssm_target(cluster: ClusterState, node: Node) -> str:
    """Session Manager's name for a HyperPod node."""
    return f"sagemaker-cluster:{cluster.cluster_id}_{node.group}-{node.instance_id}"
