"""`hpctl scale`'s choice of the nodes to add or remove, and the cluster operations that scaling starts.

Adding and removing go through the chain's own HyperPod scaler (llm_pipeline.jobs.capacity.HyperPodScaler:
BatchAddClusterNodes / BatchDeleteClusterNodes), so a group is scaled by one piece of code whoever asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpctl.common.cluster import ClusterState
from hpctl.common.errors import HpctlError
from hpctl.common.slurm_activity import SlurmActivity
from hpctl.common.table import format_table

OPERATIONS_PAGE = 20  # newest operations shown by default
OPERATIONS_MAX = 100  # ListClusterOperations MaxResults' maximum (botocore's model: 1..100)


@dataclass(frozen=True)
class ScalePlan:
    group: str
    add: int = 0
    remove: tuple[str, ...] = ()  # Slurm node names, idle ones first
    busy: tuple[str, ...] = ()  # of ``remove``, those running a job (--force only)

    def describe(self, cluster: str) -> str:
        if self.add:
            return f"add {self.add} node(s) to group {self.group} of cluster {cluster}"
        if self.remove:
            listed = ", ".join(self.remove)
            return f"remove {len(self.remove)} node(s) of group {self.group} of cluster {cluster}: {listed}"
        return f"group {self.group} of cluster {cluster} already has that many nodes: nothing to do"


def plan_scale(
    cluster: ClusterState, group: str, target: int, in_service: Sequence[str], activity: SlurmActivity, *, force: bool
) -> ScalePlan:
    """What reaching ``target`` nodes takes; refused when a node that runs a job would go, unless ``force``."""
    if not cluster.continuous:
        raise HpctlError(
            f"cluster {cluster.name} provisions nodes in standard mode: BatchAddClusterNodes and "
            "BatchDeleteClusterNodes need provisioning = continuous (cdk.json), or change count and `make deploy`"
        )
    known = [g.name for g in cluster.groups]
    if group not in known:
        raise HpctlError(f"cluster {cluster.name} has no instance group {group} (groups: {', '.join(known)})")
    if target >= len(in_service):
        return ScalePlan(group=group, add=target - len(in_service))
    surplus = len(in_service) - target
    ordered = sorted(in_service, key=activity.busy)  # idle nodes first: they go before any busy one
    chosen = tuple(ordered[:surplus])
    busy = tuple(node for node in chosen if activity.busy(node))
    if busy and not force:
        raise HpctlError(
            f"removing {surplus} node(s) of group {group} would remove {', '.join(busy)}, which "
            f"run{'s' if len(busy) == 1 else ''} a job: wait for it (`squeue`), or pass --force to remove "
            "them anyway (their jobs fail)"
        )
    return ScalePlan(group=group, remove=chosen, busy=busy)


# -- cluster operations ----------------------------------------------------------------------------------------
def list_operations(sagemaker, cluster: str, limit: int = OPERATIONS_PAGE) -> list[dict]:
    """The newest ``limit`` operations (scaling, deep health checks), newest first."""
    reply = sagemaker.list_cluster_operations(
        ClusterName=cluster, SortBy="CreationTime", SortOrder="Descending", MaxResults=limit
    )
    return reply.get("ClusterOperationSummaries", [])


def operation_detail(sagemaker, cluster: str, operation_id: str) -> str:
    """What an operation changes, group by group: target counts for scaling, the checks for a health check."""
    reply = sagemaker.describe_cluster_operation(ClusterName=cluster, OperationId=operation_id)
    parts = [
        f"{d.get('InstanceGroupName', '?')} {d.get('Original', {}).get('TargetCount', '?')}"
        f"->{d.get('Desired', {}).get('TargetCount', '?')} ({d.get('Status', '?')})"
        for d in reply.get("ScalingDetails", [])
    ]
    parts += [
        f"{d.get('InstanceGroupName', '?')}: {', '.join(d.get('DeepHealthChecks', []))}"
        for d in reply.get("DeepHealthCheckDetails", [])
    ]
    return "; ".join(parts) or "-"


def render_operations(operations: Sequence[dict], details: dict[str, str]) -> str:
    if not operations:
        return "no cluster operations yet (scaling and deep health checks start them)"
    rows = [
        [
            op["OperationId"],
            op.get("Type", "-"),
            op.get("Status", "-"),
            op["CreationTime"].strftime("%Y-%m-%d %H:%M:%S") if op.get("CreationTime") else "-",
            details.get(op["OperationId"], ""),
        ]
        for op in operations
    ]
    return format_table(["OPERATION", "TYPE", "STATUS", "CREATED", "DETAIL"], rows)


def in_progress(operations: Sequence[dict]) -> list[str]:
    return [op["OperationId"] for op in operations if op.get("Status") == "InProgress"]
