"""`hpctl logs lifecycle`: what each node's lifecycle script wrote, from CloudWatch Logs.

HyperPod writes one log group per cluster creation and one stream per node:
/aws/sagemaker/Clusters/<name>/<id>, stream LifecycleConfig/<group>/<instance-id>. The group outlives
the cluster, so after a failed create (rolled back, cluster gone) the newest group under the
cluster name's prefix still holds what the nodes did.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

import boto3
from botocore.exceptions import ClientError

from cluster_contract import StackOutput
from hpctl.common.cluster import ClusterNotFound, ClusterState, describe_cluster
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.stack import StackNotFound, describe_stack, template_cluster_name

STREAM_PREFIX = "LifecycleConfig/"
LOG_GROUP_ROOT = "/aws/sagemaker/Clusters/"


def log_group_name(cluster: ClusterState) -> str:
    return f"{LOG_GROUP_ROOT}{cluster.name}/{cluster.cluster_id}"


def cluster_name_of(session: boto3.Session, stack_name: str) -> str:
    """The stack's cluster name: its output, or (failed create, no outputs) its template."""
    try:
        stack = describe_stack(session, stack_name)
        return stack.output(StackOutput.CLUSTER_NAME) or template_cluster_name(session, stack_name)
    except StackNotFound as error:
        raise HpctlError(
            f"stack {stack_name} not found in region {session.region_name}: name the cluster instead "
            "(`hpctl logs lifecycle --cluster <name_prefix>-cluster`), or pass --stack / --region"
        ) from error


def newest_log_group(session: boto3.Session, cluster_name: str) -> str:
    """The log group of the cluster's latest CreateCluster (one per creation, never deleted)."""
    prefix = f"{LOG_GROUP_ROOT}{cluster_name}/"
    groups = []
    with aws_errors(f"list the log groups under {prefix}"):
        for page in session.client("logs").get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            groups += page["logGroups"]
    if not groups:
        raise HpctlError(
            f"cluster {cluster_name} does not exist in {session.region_name} and left no log group "
            f"under {prefix}: its creation never reached the nodes; `hpctl wait` shows the stack's events"
        )
    newest = max(groups, key=lambda group: group.get("creationTime", 0))
    created = datetime.fromtimestamp(newest.get("creationTime", 0) / 1000, tz=timezone.utc)
    print(
        f"note: cluster {cluster_name} does not exist (a failed create rolls it back); showing its newest "
        f"log group {newest['logGroupName']} (created {created:%Y-%m-%d %H:%M:%S} UTC, "
        f"{len(groups)} under {prefix})",
        file=sys.stderr,
        flush=True,
    )
    return newest["logGroupName"]


def find_log_group(session: boto3.Session, *, stack_name: str, cluster_name: str | None) -> str:
    """The running cluster's log group, else the newest one its name left behind."""
    name = cluster_name or cluster_name_of(session, stack_name)
    try:
        return log_group_name(describe_cluster(session, name))
    except ClusterNotFound:
        return newest_log_group(session, name)


def _is_missing(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ResourceNotFoundException"


def lifecycle_streams(logs, group: str, *, node: str | None) -> list[str]:
    """Stream names of every node, or of the one instance / instance group ``node`` names."""
    streams: list[str] = []
    with aws_errors(f"list the log streams of {group}"):
        try:
            for page in logs.get_paginator("describe_log_streams").paginate(
                logGroupName=group, logStreamNamePrefix=STREAM_PREFIX
            ):
                streams += [stream["logStreamName"] for stream in page["logStreams"]]
        except ClientError as error:
            if not _is_missing(error):
                raise
    if not streams:
        raise HpctlError(
            f"no lifecycle logs yet ({group} has none): nodes write them once their lifecycle "
            "script starts; check `hpctl status`"
        )
    if node:
        chosen = [name for name in streams if node in name.split("/")[1:]]
        if not chosen:
            nodes = ", ".join(name.removeprefix(STREAM_PREFIX) for name in streams)
            raise HpctlError(f"no lifecycle log for {node} (logs exist for: {nodes})")
        streams = chosen
    return sorted(streams)


def format_event(event: dict, *, label: str) -> str:
    moment = datetime.fromtimestamp(event["timestamp"] / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"{label}{moment}  {event['message'].rstrip()}"


def print_stream(logs, group: str, stream: str, *, tail: int) -> int:
    """Print a whole stream (or its last ``tail`` events); returns the newest timestamp seen."""
    newest = 0
    with aws_errors(f"read log stream {stream}"):
        if tail:
            reply = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=False, limit=tail)
            pages = [reply["events"]]
        else:
            pages = _all_pages(logs, group, stream)
        for events in pages:
            for event in events:
                print(format_event(event, label=""))
                newest = max(newest, event["timestamp"])
    return newest


def _all_pages(logs, group: str, stream: str):
    token = None
    while True:
        kwargs = {"nextToken": token} if token else {}
        reply = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True, **kwargs)
        yield reply["events"]
        if reply.get("nextForwardToken") in (None, token):
            return
        token = reply["nextForwardToken"]


# FilterLogEvents takes at most this many stream names per call (the API's limit); clusters have up to 256 nodes.
MAX_STREAMS_PER_FILTER = 100


def batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def follow_streams(
    logs,
    group: str,
    streams: list[str],
    *,
    since_ms: int,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print new events of ``streams`` as they arrive, until interrupted (Ctrl-C)."""
    seen: set[str] = set()
    labelled = len(streams) > 1
    print(f"following {len(streams)} stream(s); Ctrl-C stops", flush=True)
    try:
        while True:
            with aws_errors(f"read {group}"):
                events = [
                    event
                    for batch in batches(streams, MAX_STREAMS_PER_FILTER)
                    for page in logs.get_paginator("filter_log_events").paginate(
                        logGroupName=group, logStreamNames=batch, startTime=since_ms
                    )
                    for event in page["events"]
                    if event["eventId"] not in seen
                ]
            for event in sorted(events, key=lambda item: item["timestamp"]):
                seen.add(event["eventId"])
                label = f"[{event['logStreamName'].removeprefix(STREAM_PREFIX)}] " if labelled else ""
                print(format_event(event, label=label), flush=True)
                since_ms = max(since_ms, event["timestamp"])
            sleep(interval_s)
    except KeyboardInterrupt:
        print()


def show_lifecycle_logs(
    session: boto3.Session,
    group: str,
    *,
    node: str | None,
    tail: int,
    follow: bool,
    interval_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    logs = session.client("logs")
    streams = lifecycle_streams(logs, group, node=node)
    newest = 0
    for stream in streams:
        if len(streams) > 1:
            print(f"==> {stream} <==")
        newest = max(newest, print_stream(logs, group, stream, tail=tail))
    if follow:
        follow_streams(logs, group, streams, since_ms=newest + 1 if newest else 0, interval_s=interval_s, sleep=sleep)
