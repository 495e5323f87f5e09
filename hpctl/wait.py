"""`hpctl wait`: follow the deploy and the cluster until the cluster is in service (or failed)."""

from __future__ import annotations

import time
from collections.abc import Callable

import boto3

from hpctl.cluster import ClusterState, describe_cluster
from hpctl.errors import HpctlError
from hpctl.stack import StackNotFound, describe_stack, require_outputs


def progress_line(cluster: ClusterState) -> str:
    groups = ", ".join(f"{group.name} {group.current}/{group.target}" for group in cluster.groups)
    return f"cluster {cluster.name} {cluster.status}" + (f" (nodes {groups})" if groups else "")


def poll_once(session: boto3.Session, stack_name: str) -> tuple[ClusterState | None, str]:
    """The cluster when the stack already names it, and a one-line progress report."""
    try:
        stack = describe_stack(session, stack_name)
    except StackNotFound:  # `cdk deploy` publishes its assets (the image) before it creates the stack
        return None, f"stack {stack_name} not created yet in {session.region_name}"
    if stack.in_progress and not stack.output("ClusterName"):
        return None, f"stack {stack_name} {stack.status} (the cluster is named once the deploy finishes)"
    cluster = describe_cluster(session, require_outputs(stack).output("ClusterName"))
    if cluster.status == "Failed":
        raise HpctlError(f"cluster {cluster.name} failed: {cluster.failure_message or 'no reason given'}")
    return cluster, progress_line(cluster)


def wait_in_service(
    session: boto3.Session,
    stack_name: str,
    *,
    timeout_s: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ClusterState:
    start = clock()
    while True:
        cluster, line = poll_once(session, stack_name)
        elapsed = clock() - start
        print(f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {line}", flush=True)
        if cluster is not None and cluster.status == "InService":
            return cluster
        if elapsed >= timeout_s:
            raise HpctlError(
                f"not in service after {timeout_s:g} s (last: {line}): run `hpctl wait` again; "
                "`hpctl logs lifecycle` shows what the nodes are doing"
            )
        sleep(min(interval_s, timeout_s - elapsed))
