"""Node operations on the deployed cluster through HyperPod's API: the node table, reboot and replace,
deep health checks on demand, and the cluster's events (continuous provisioning)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from hpctl.common.cluster import ClusterState, Node
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.table import format_table
from llm_pipeline.run_files import AlertLine
from stacks.accelerators import INSTANCE_TYPES

BATCH_LIMIT = 25  # nodes per BatchReboot/BatchReplaceClusterNodes request (botocore's model: 1..25)
EVENTS_PAGE_LIMIT = 100  # ListClusterEvents MaxResults (1..100)
# The deep health checks hpctl starts unless told otherwise: stress and connectivity per instance.
# MultiNodeTrainingValidation is opt-in (--check): it runs a training job across the group's nodes.
DEFAULT_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity")
HEALTH = {  # InstanceStatus.Status -> what the health column says
    "Running": "ok",
    "Failure": "failed",
    "DeepHealthCheckInProgress": "checking",
    "Pending": "-",
    "SystemUpdating": "updating",
}


class NodeOperationFailed(HpctlError):
    """HyperPod refused the operation for some nodes: exit 1, as for a failed deploy."""

    exit_code = 1


@dataclass(frozen=True)
class NodeAction:
    """Reboot or replace: the API call and what the confirmation must say before it."""

    verb: str
    operation: str  # the sagemaker client method
    warning: str


REBOOT = NodeAction(
    verb="reboot",
    operation="batch_reboot_cluster_nodes",
    warning="a reboot stops what runs on them (Slurm requeues or fails their jobs)",
)
REPLACE = NodeAction(
    verb="replace",
    operation="batch_replace_cluster_nodes",
    warning="a replacement terminates them and wipes their root and secondary volumes (FSx and S3 are kept)",
)
NODE_ACTIONS = {action.verb: action for action in (REBOOT, REPLACE)}


def node_rows(nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    return [
        (
            node.slurm_name or "-",
            node.instance_id or "-",
            node.logical_id or "-",
            node.group,
            node.status,
            HEALTH.get(node.status, node.status.lower()) + (f": {node.message}" if node.message else ""),
        )
        for node in nodes
    ]


def render_nodes(cluster: ClusterState, nodes: Sequence[Node]) -> str:
    if not nodes:
        return f"cluster {cluster.name} ({cluster.status}) has no nodes yet: `hpctl wait` follows them"
    header = ("SLURM NAME", "INSTANCE", "LOGICAL ID", "GROUP", "STATE", "HEALTH")
    return f"cluster {cluster.name} ({cluster.status}, {cluster.provisioning} provisioning)\n" + format_table(
        header, node_rows(nodes)
    )


def resolve_nodes(names: Iterable[str], nodes: Sequence[Node], *, cluster: str) -> list[Node]:
    """The nodes named by Slurm name (ip-10-1-2-3), instance id or logical id, each once, in order given."""
    chosen: list[Node] = []
    unknown = []
    for name in names:
        match = next((node for node in nodes if name in (node.slurm_name, node.instance_id, node.logical_id)), None)
        if match is None:
            unknown.append(name)
        elif match not in chosen:
            chosen.append(match)
    if unknown:
        known = ", ".join(node.slurm_name or node.instance_id or node.logical_id for node in nodes) or "none"
        raise HpctlError(
            f"no node {', '.join(unknown)} in cluster {cluster} (nodes: {known}): "
            "name a node by its Slurm name, instance id or logical id from `hpctl nodes`"
        )
    return chosen


def action_question(action: NodeAction, cluster: ClusterState, targets: Sequence[Node], controller_group: str) -> str:
    listed = ", ".join(f"{node.slurm_name or node.instance_id or node.logical_id} ({node.group})" for node in targets)
    controller = (
        f"; {controller_group} holds the Slurm controller: every running job loses its scheduler meanwhile"
        if any(node.group == controller_group for node in targets)
        else ""
    )
    return f"{action.verb} {len(targets)} node(s) of cluster {cluster.name}: {listed}; {action.warning}{controller}?"


def act_on_nodes(sagemaker, action: NodeAction, cluster: ClusterState, targets: Sequence[Node]) -> list[str]:
    """Send the request in batches of 25, by logical id in continuous mode (a node waiting for its
    instance has none yet) and by instance id otherwise; the lines to print, or NodeOperationFailed."""
    by_logical = cluster.continuous and all(node.logical_id for node in targets)
    key, id_of = ("NodeLogicalIds", "logical_id") if by_logical else ("NodeIds", "instance_id")
    missing = [node.slurm_name or node.logical_id for node in targets if not getattr(node, id_of)]
    if missing:
        raise HpctlError(f"cannot {action.verb} {', '.join(missing)}: no instance yet (see `hpctl nodes`)")
    done, failed = [], []
    call: Callable = getattr(sagemaker, action.operation)
    with aws_errors(f"{action.verb} nodes of cluster {cluster.name}"):
        for start in range(0, len(targets), BATCH_LIMIT):
            batch = [getattr(node, id_of) for node in targets[start : start + BATCH_LIMIT]]
            reply = call(ClusterName=cluster.name, **{key: batch})
            done += reply.get("Successful", []) + reply.get("SuccessfulNodeLogicalIds", [])
            for error in reply.get("Failed", []) + reply.get("FailedNodeLogicalIds", []):
                node_id = error.get("NodeId") or error.get("NodeLogicalId")
                failed.append(f"{node_id}: {error['ErrorCode']}: {error['Message']}")
    lines = [f"{action.verb} started: {node_id}" for node_id in done]
    if failed:
        raise NodeOperationFailed("\n".join([*lines, f"{action.verb} refused for " + "; ".join(failed)]))
    return [*lines, "`hpctl nodes` shows their state as they come back"]


def health_check_groups(cluster: ClusterState, group: str | None) -> list[str]:
    """The named group, else every group of accelerated instances (deep health checks cover GPUs and Trainium)."""
    names = [item.name for item in cluster.groups]
    if group:
        if group not in names:
            raise HpctlError(f"no instance group {group} in cluster {cluster.name} (groups: {', '.join(names)})")
        return [group]
    accelerated = [
        item.name
        for item in cluster.groups
        if item.instance_type in INSTANCE_TYPES and INSTANCE_TYPES[item.instance_type].accelerated
    ]
    if not accelerated:
        raise HpctlError(
            f"cluster {cluster.name} has no GPU or Trainium group (deep health checks test accelerators): "
            "name a group to check it anyway"
        )
    return accelerated


def start_health_check(sagemaker, cluster: ClusterState, groups: Sequence[str], checks: Sequence[str]) -> str:
    with aws_errors(f"start a deep health check on cluster {cluster.name}"):
        sagemaker.start_cluster_health_check(
            ClusterName=cluster.name,
            DeepHealthCheckConfigurations=[
                {"InstanceGroupName": group, "DeepHealthChecks": list(checks)} for group in groups
            ],
        )
    return (
        f"deep health check ({', '.join(checks)}) started on {', '.join(groups)}: the nodes show "
        "DeepHealthCheckInProgress in `hpctl nodes`; HyperPod reboots or replaces the ones that fail"
    )


@dataclass(frozen=True)
class ClusterEvent:
    time: datetime
    level: str
    resource: str
    description: str


def cluster_events(
    sagemaker, cluster: ClusterState, *, limit: int, group: str | None = None, node_id: str | None = None
) -> list[ClusterEvent]:
    """The newest ``limit`` events, oldest first; HyperPod keeps them only for continuous provisioning."""
    if not cluster.continuous:
        raise HpctlError(
            f"cluster {cluster.name} uses standard provisioning: HyperPod records cluster events only with "
            "continuous provisioning (cdk.json provisioning = continuous, set when the cluster is created); "
            "`hpctl logs lifecycle` and `hpctl status` show what the nodes do"
        )
    query = {"ClusterName": cluster.name, "SortBy": "EventTime", "SortOrder": "Descending"}
    query |= {"InstanceGroupName": group} if group else {}
    query |= {"NodeId": node_id} if node_id else {}
    events: list[ClusterEvent] = []
    with aws_errors(f"read the events of cluster {cluster.name}"):
        while len(events) < limit:
            reply = sagemaker.list_cluster_events(**query, MaxResults=min(EVENTS_PAGE_LIMIT, limit - len(events)))
            for item in reply.get("Events", []):
                where = "/".join(filter(None, (item.get("InstanceGroupName"), item.get("InstanceId"))))
                events.append(
                    ClusterEvent(
                        time=item["EventTime"],
                        level=item.get("EventLevel", "-"),
                        resource=where or item["ResourceType"],
                        description=item.get("Description", ""),
                    )
                )
            if not reply.get("NextToken"):
                break
            query["NextToken"] = reply["NextToken"]
    return list(reversed(events[:limit]))


EVENT_COLUMNS = ("TIME", "LEVEL", "RESOURCE", "EVENT")
# A run alert's level in the events table, by its state (llm_pipeline.jobs.alerts): what needs someone is an Error.
ALERT_LEVELS = {"failed": "Error", "nan-stop": "Error", "stalled": "Warn"}


def alert_event(alert: AlertLine) -> ClusterEvent:
    """A run's alert as a row of the events table: its time, run and step, state and detail."""
    run = alert.run.rstrip("/").rsplit("/", 1)[-1]
    time = datetime.strptime(alert.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    detail = f"{alert.state}: {alert.detail}" if alert.detail else alert.state
    return ClusterEvent(time, ALERT_LEVELS.get(alert.state, "Info"), f"run:{run}/{alert.step}", detail)


def event_rows(events: Sequence[ClusterEvent]) -> list[tuple[str, str, str, str]]:
    return [(f"{event.time:%Y-%m-%d %H:%M:%S}", event.level, event.resource, event.description) for event in events]


def render_events(cluster: ClusterState, events: Sequence[ClusterEvent]) -> str:
    if not events:
        return f"no events for cluster {cluster.name}"
    return format_table(EVENT_COLUMNS, event_rows(events), indent="")


def by_time(events: Iterable[ClusterEvent]) -> list[ClusterEvent]:
    """Oldest first; cluster events (their times carry a zone) and run alerts (UTC) interleaved."""
    return sorted(events, key=lambda event: event.time.timestamp())


def follow_events(
    read: Callable[[], list[ClusterEvent]],
    *,
    shown: Iterable[ClusterEvent],
    poll_s: float,
    sleep: Callable[[float], None],
    emit: Callable[[str], None],
) -> None:
    """Every ``poll_s``: ``read`` the newest events and alerts again and ``emit`` each one not shown yet, one table
    row a line, until interrupted (Ctrl-C)."""
    seen = set(shown)
    while True:
        sleep(poll_s)
        for event in by_time(read()):
            if event not in seen:
                seen.add(event)
                emit("  ".join(event_rows([event])[0]))
