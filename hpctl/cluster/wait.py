"""`hpctl wait`: follow the deploy and the cluster until the deploy is complete, the cluster is in
service and every instance group has its nodes (its target, or its minimum where one is set); a
failed or rolled-back deploy (create or update) or a failed cluster exits 1 with the first failed
stack event."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import boto3

from cluster_contract import StackOutput
from hpctl.common.cluster import ClusterState, describe_cluster
from hpctl.common.errors import DeployFailed, HpctlError
from hpctl.common.stack import (
    NO_ROLLBACK_HINT,
    EventFeed,
    StackNotFound,
    deploy_failed,
    describe_stack,
    require_outputs,
)


def progress_line(cluster: ClusterState) -> str:
    groups = ", ".join(group.progress() for group in cluster.groups)
    return f"cluster {cluster.name} {cluster.status}" + (f" (nodes {groups})" if groups else "")


def ready(cluster: ClusterState) -> bool:
    """In service with every group at its target or minimum: a continuous-mode cluster is InService once
    the controller is, while its compute groups still fill up."""
    return cluster.status == "InService" and not cluster.filling


def stack_failed(stack_name: str, status: str, feed: EventFeed) -> DeployFailed:
    cause = feed.first_failure()
    where = f": {cause.logical_id} ({cause.resource_type}) {cause.status}: {cause.reason}" if cause else ""
    return DeployFailed(
        f"stack {stack_name} is {status}{where}. `hpctl logs lifecycle` shows the nodes' setup logs "
        f"(they outlive the rollback); {NO_ROLLBACK_HINT}"
    )


@dataclass(frozen=True)
class Poll:
    cluster: ClusterState | None  # once the stack names it
    events: list[str]  # stack events new since the last poll, while the stack changes
    line: str  # one-line progress report
    failure: HpctlError | None = None
    deploying: bool = False  # the stack is still being created or updated: not done, whatever the cluster says


def poll_once(session: boto3.Session, stack_name: str, feed: EventFeed) -> Poll:
    try:
        stack = describe_stack(session, stack_name)
    except StackNotFound:  # `cdk deploy` publishes its assets (the image) before it creates the stack
        return Poll(None, [], f"stack {stack_name} not created yet in {session.region_name}")
    failed = deploy_failed(stack.status)
    events = [event.line() for event in feed.new_events(session)] if stack.in_progress or failed else []
    line = f"stack {stack_name} {stack.status}"
    if failed:
        return Poll(None, events, line, failure=stack_failed(stack_name, stack.status, feed))
    if stack.in_progress and not stack.output(StackOutput.CLUSTER_NAME):
        return Poll(None, events, f"{line} (the cluster is named once the deploy finishes)", deploying=True)
    cluster = describe_cluster(session, require_outputs(stack).output(StackOutput.CLUSTER_NAME))
    if cluster.status == "Failed":
        failure = DeployFailed(f"cluster {cluster.name} failed: {cluster.failure_message or 'no reason given'}")
        return Poll(cluster, events, progress_line(cluster), failure=failure)
    if stack.in_progress:  # an update: the old cluster serves until CloudFormation is done with it
        return Poll(cluster, events, f"{line}, {progress_line(cluster)}", deploying=True)
    return Poll(cluster, events, progress_line(cluster))


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
    feed = EventFeed(stack_name)
    while True:
        poll = poll_once(session, stack_name, feed)
        elapsed = clock() - start
        for event in poll.events:
            print(event, flush=True)
        if poll.failure:
            raise poll.failure
        line = poll.line
        waiting_for_nodes = poll.cluster is not None and poll.cluster.status == "InService" and not poll.deploying
        if waiting_for_nodes and poll.cluster.filling:
            line += "; waiting for nodes: " + ", ".join(group.progress() for group in poll.cluster.filling)
        print(f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {line}", flush=True)
        if waiting_for_nodes and ready(poll.cluster):
            return poll.cluster
        if elapsed >= timeout_s:
            what = "not every group has its nodes" if waiting_for_nodes else "not in service"
            raise HpctlError(
                f"{what} after {timeout_s:g} s (last: {line}): run `hpctl wait` again; "
                "`hpctl logs lifecycle` shows what the nodes are doing"
                + ("; `hpctl events` shows why HyperPod has not placed them" if waiting_for_nodes else "")
            )
        sleep(min(interval_s, timeout_s - elapsed))
