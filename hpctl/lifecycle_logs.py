"""`hpctl logs lifecycle`: what each node's lifecycle script wrote, from CloudWatch Logs.

HyperPod writes one log group per cluster creation and one stream per node:
/aws/sagemaker/Clusters/<name>/<id>, stream LifecycleConfig/<group>/<instance-id>.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

import boto3
from botocore.exceptions import ClientError

from hpctl.cluster import ClusterState
from hpctl.errors import HpctlError, aws_errors

STREAM_PREFIX = "LifecycleConfig/"


def log_group_name(cluster: ClusterState) -> str:
    return f"/aws/sagemaker/Clusters/{cluster.name}/{cluster.cluster_id}"


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
                pages = logs.get_paginator("filter_log_events").paginate(
                    logGroupName=group, logStreamNames=streams, startTime=since_ms
                )
                events = [event for page in pages for event in page["events"] if event["eventId"] not in seen]
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
    cluster: ClusterState,
    *,
    node: str | None,
    tail: int,
    follow: bool,
    interval_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    logs = session.client("logs")
    group = log_group_name(cluster)
    streams = lifecycle_streams(logs, group, node=node)
    newest = 0
    for stream in streams:
        if len(streams) > 1:
            print(f"==> {stream} <==")
        newest = max(newest, print_stream(logs, group, stream, tail=tail))
    if follow:
        follow_streams(logs, group, streams, since_ms=newest + 1 if newest else 0, interval_s=interval_s, sleep=sleep)
