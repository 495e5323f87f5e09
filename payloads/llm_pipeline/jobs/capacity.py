"""Capacity that follows the pipeline: a chain claims the nodes it needs and gives them back (stdlib only).

A compute group with ``scale_with_runs`` (cdk.json) keeps only its floor (``min_instance_count``, 0 allowed)
while no chain runs. Submitting a chain on its partition records a claim for the chain's nodes and asks the
scaler for the nodes the live claims need beyond those in service (at most the group's ``count``); a release
job, after the chain's last job whatever its end (``--dependency=afterany``: success, a failed step, a
scancel), removes the claim and gives back the nodes no live claim needs, down to the floor.

Several chains share a group through one claims file on shared storage (FSx), changed only under a lock (a
directory made with mkdir: atomic on every POSIX file system, Lustre included). A node is only given back when
it runs no job: it is drained first (Slurm starts nothing new there), checked idle, then removed; the release
job's own node counts as idle (its only job is the release, which ends right after).

The scaler is HyperPod's BatchAddClusterNodes / BatchDeleteClusterNodes (``HyperPodScaler``) on the cluster;
``HPL_SCALER=module:Class`` names another (the local Slurm's node scaler in tools/local_slurm.py, which takes
nodes up and down with scontrol, for the offline rehearsal).

    python3 -m llm_pipeline.jobs.capacity wait --nodes N        # the chain's first job: its nodes up, or fail
    python3 -m llm_pipeline.jobs.capacity release --claim ID    # the release job's command
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llm_pipeline.errors import StepError

# What the deploy's partition facts say about scaling (stacks/config.partition_facts), as each job sees it.
SCALE_ENV = {
    "scale_with_runs": "HPL_SCALE_WITH_RUNS",
    "group": "HPL_SCALE_GROUP",
    "min_instance_count": "HPL_SCALE_FLOOR",
    "count": "HPL_SCALE_CEILING",
}
CLAIMS_DIR_VARIABLE = "HPL_CAPACITY_DIR"  # where the claims files live: shared by every chain on the cluster
SCALER_VARIABLE = "HPL_SCALER"
CLAIM_VARIABLE = "HPL_CAPACITY_CLAIM"
CLUSTER_VARIABLE = "HPL_CLUSTER_NAME"
RELEASE_STEP = "release-capacity"
WAIT_STEP = "wait-capacity"
WAIT_VARIABLE = "HPL_CAPACITY_WAIT_S"
# HyperPod provisions a node and runs its lifecycle script in minutes to half an hour: a node not up after an hour
# did not come (capacity, a failed lifecycle script); `hpctl events` says why.
WAIT_DEFAULT_S = 3600.0
READY_STATES = ("idle", "alloc", "mix")  # sinfo's %t for a node that runs jobs (a flag such as * or # is not up)
LOCK_WAIT_S = 120.0
LOCK_STALE_S = 600.0  # a lock older than this was left by a killed process: nothing holds a lock for minutes


class Scaler(Protocol):
    """What capacity needs from whatever adds and removes a group's nodes."""

    def in_service(self, group: str) -> list[str]:
        """The group's nodes Slurm may schedule on (by Slurm node name)."""

    def add(self, group: str, count: int) -> None:
        """Ask for ``count`` more nodes in the group."""

    def remove(self, group: str, nodes: Sequence[str]) -> None:
        """Give these (drained, idle) nodes back."""


@dataclass(frozen=True)
class Group:
    """One scaled compute group, as the partition's facts describe it."""

    name: str
    partition: str
    floor: int  # nodes kept with no claim (min_instance_count)
    ceiling: int  # the most nodes claims may bring (count)

    def wanted(self, claims: Mapping[str, int]) -> int:
        """Nodes the live claims need: their sum, within [floor, ceiling]."""
        return max(self.floor, min(self.ceiling, sum(claims.values())))


def group_from_env(env: Mapping[str, str]) -> Group | None:
    """The run's partition's group when it scales with runs, else None."""
    if env.get(SCALE_ENV["scale_with_runs"], "") not in ("1", "true", "True"):
        return None
    partition = env.get("HPL_PARTITION", "")
    return Group(
        name=env.get(SCALE_ENV["group"]) or partition,
        partition=partition,
        floor=int(env.get(SCALE_ENV["min_instance_count"], "0")),
        ceiling=int(env.get(SCALE_ENV["count"], "0")),
    )


def scaling_environment(facts: Mapping[str, object]) -> dict[str, str]:
    """HPL_SCALE_* for a partition's facts (empty for a group that does not scale with runs)."""
    if not facts.get("scale_with_runs"):
        return {}
    return {variable: str(int(facts[key]) if key != "group" else facts[key]) for key, variable in SCALE_ENV.items()}


# -- the claims file ---------------------------------------------------------------------------------------------
def claims_path(env: Mapping[str, str], group: Group) -> Path:
    folder = env.get(CLAIMS_DIR_VARIABLE) or os.path.join(env.get("HPL_FSX_MOUNT_PATH") or "/fsx", "capacity")
    return Path(folder) / f"{group.name}.json"


@contextlib.contextmanager
def locked(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``<path>.lock`` (a directory: mkdir is atomic) while the claims change."""
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - lock.stat().st_mtime > LOCK_STALE_S:
                    lock.rmdir()
                    continue
            if time.monotonic() > deadline:
                raise StepError(
                    f"{lock} is held for more than {wait_s:.0f} s: remove it if no submit or release runs"
                ) from None
            time.sleep(0.1)
    try:
        yield
    finally:
        lock.rmdir()


@contextlib.contextmanager
def permission_refusal(path: Path) -> Iterator[None]:
    """A claims folder this user may not write: one line naming it and the way out, not a traceback."""
    try:
        yield
    except PermissionError as error:
        if not str(error.filename or "").startswith(str(path.parent)):
            raise StepError(f"capacity: {error.strerror}: {error.filename}") from None
        raise StepError(
            f"cannot change the capacity claims in {path.parent} ({error.strerror}: {error.filename}): every "
            "cluster user must be able to write there; the node lifecycle makes it group-writable for the cluster "
            "group (docs/teams.md): ask the admin to provision the controller again"
        ) from None


def read_claims(path: Path) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads(path.read_text()).get("claims", {}).items()}
    except FileNotFoundError:
        return {}


def write_claims(path: Path, claims: Mapping[str, int]) -> None:
    """Write whole, then rename: a reader sees the old file or the new one."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps({"claims": dict(claims)}, indent=1, sort_keys=True))
    os.replace(partial, path)


# -- the usage ledger: node-seconds the group held, against always-on -------------------------------------------------
def usage_path(claims: Path) -> Path:
    return claims.with_suffix(".usage.json")


def account(usage: Mapping[str, float], nodes: int, ceiling: int, now: float) -> dict[str, float]:
    """The ledger after the group changed to ``nodes`` at ``now``: the node-seconds held so far at the old count
    are added up (from the first claim on: before it the group sat at its floor)."""
    if not usage:
        return {"since": now, "at": now, "nodes": nodes, "ceiling": ceiling, "node_seconds": 0.0}
    held = float(usage["node_seconds"]) + float(usage["nodes"]) * (now - float(usage["at"]))
    return {**usage, "at": now, "nodes": nodes, "ceiling": ceiling, "node_seconds": held}


def node_hours(usage: Mapping[str, float], now: float) -> tuple[float, float]:
    """(node-hours the group held, node-hours ``ceiling`` nodes always on would have held) since the first claim."""
    held = float(usage["node_seconds"]) + float(usage["nodes"]) * (now - float(usage["at"]))
    return held / 3600, float(usage["ceiling"]) * (now - float(usage["since"])) / 3600


def record_usage(path: Path, nodes: int, ceiling: int) -> None:
    """Under the claims lock: the group now has ``nodes`` in service (or asked for)."""
    ledger = usage_path(path)
    try:
        usage = json.loads(ledger.read_text())
    except FileNotFoundError:
        usage = {}
    partial = ledger.with_suffix(".partial")
    partial.write_text(json.dumps(account(usage, nodes, ceiling, time.time()), sort_keys=True))
    os.replace(partial, ledger)


# -- claim and release ---------------------------------------------------------------------------------------------
def claim(group: Group, nodes: int, scaler: Scaler, path: Path) -> str:
    """Record a claim for ``nodes`` and ask for what the live claims need beyond the nodes in service."""
    if nodes > group.ceiling:
        raise StepError(
            f"the chain needs {nodes} nodes and group {group.name} scales to at most {group.ceiling} (its count in "
            "cdk.json): raise count, or lower [parallel] nodes"
        )
    claim_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with permission_refusal(path), locked(path):
        claims = {**read_claims(path), claim_id: nodes}
        write_claims(path, claims)
        up = len(scaler.in_service(group.name))
        missing = group.wanted(claims) - up
        if missing > 0:
            scaler.add(group.name, missing)
        record_usage(path, up + max(missing, 0), group.ceiling)
    return claim_id


def release(
    group: Group, claim_id: str, scaler: Scaler, path: Path, *, busy: BusyCheck, drain: DrainNodes, own_node: str = ""
) -> list[str]:
    """Drop the claim and give back the idle nodes no live claim needs, down to the floor; the nodes removed."""
    with permission_refusal(path), locked(path):
        claims = read_claims(path)
        claims.pop(claim_id, None)
        write_claims(path, claims)
        up = scaler.in_service(group.name)
        surplus = len(up) - group.wanted(claims)
        if surplus <= 0:
            return []
        # Idle ones first, the release job's own node last (it runs nothing else): the chain's nodes go back.
        idle = [node for node in up if node != own_node and not busy(node)]
        if own_node in up and not busy(own_node, ignore_own=True):
            idle.append(own_node)
        chosen = idle[:surplus]
        if not chosen:
            return []
        drain(chosen)  # nothing new starts there; what started meanwhile keeps its node
        gone = [node for node in chosen if not busy(node, ignore_own=node == own_node)]
        if gone:
            scaler.remove(group.name, gone)
            record_usage(path, len(up) - len(gone), group.ceiling)
        return gone


class BusyCheck(Protocol):
    def __call__(self, node: str, ignore_own: bool = False) -> bool: ...


class DrainNodes(Protocol):
    def __call__(self, nodes: Sequence[str]) -> None: ...


def slurm_busy(node: str, ignore_own: bool = False) -> bool:
    """Whether Slurm runs a job on ``node`` (the calling job aside when ``ignore_own``)."""
    out = subprocess.run(
        ["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%A"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return True  # cannot tell: keep the node
    jobs = set(out.stdout.split())
    if ignore_own:
        jobs.discard(os.environ.get("SLURM_JOB_ID", ""))
    return bool(jobs)


def slurm_drain(nodes: Sequence[str]) -> None:
    subprocess.run(
        ["scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", "reason=hpl-capacity-release"],
        capture_output=True,
        text=True,
    )


# -- scalers -----------------------------------------------------------------------------------------------------
class HyperPodScaler:
    """HyperPod's node APIs (continuous provisioning): BatchAddClusterNodes raises a group's target count,
    BatchDeleteClusterNodes removes nodes by instance id. Slurm names HyperPod nodes by private DNS host name
    (ip-10-1-2-3), which ListClusterNodes reports beside each instance id."""

    MAX_ADD = 50  # AddClusterNodeSpecification.IncrementTargetCountBy's maximum (botocore's model)

    def __init__(self, cluster: str, client: object | None = None) -> None:
        if client is None:
            import boto3  # in the training images and on HyperPod's AMI; only the scaler needs it

            client = boto3.client("sagemaker")
        self.cluster = cluster
        self.client = client

    def _nodes(self, group: str) -> list[dict]:
        found: list[dict] = []
        token = None
        while True:
            page = self.client.list_cluster_nodes(
                ClusterName=self.cluster, InstanceGroupNameContains=group, **({"NextToken": token} if token else {})
            )
            found += [n for n in page["ClusterNodeSummaries"] if n["InstanceGroupName"] == group]
            token = page.get("NextToken")
            if not token:
                return found

    def in_service(self, group: str) -> list[str]:
        return [
            short_host(n.get("PrivateDnsHostname", ""))
            for n in self._nodes(group)
            if n["InstanceStatus"]["Status"] in ("Running", "Pending")
        ]

    def add(self, group: str, count: int) -> None:
        while count > 0:
            step = min(count, self.MAX_ADD)
            self.client.batch_add_cluster_nodes(
                ClusterName=self.cluster, NodesToAdd=[{"InstanceGroupName": group, "IncrementTargetCountBy": step}]
            )
            count -= step

    def remove(self, group: str, nodes: Sequence[str]) -> None:
        ids = {short_host(n.get("PrivateDnsHostname", "")): n["InstanceId"] for n in self._nodes(group)}
        wanted = [ids[node] for node in nodes if node in ids]
        if wanted:
            self.client.batch_delete_cluster_nodes(ClusterName=self.cluster, NodeIds=wanted)


def short_host(name: str) -> str:
    return name.split(".")[0]


def make_scaler(env: Mapping[str, str]) -> Scaler:
    named = env.get(SCALER_VARIABLE, "")
    if named:
        module, _, cls = named.partition(":")
        return getattr(importlib.import_module(module), cls)()
    cluster = env.get(CLUSTER_VARIABLE, "")
    if not cluster:
        raise StepError(f"{CLUSTER_VARIABLE} is not set: the node profile sets it on the cluster (cluster-facts.json)")
    return HyperPodScaler(cluster)


def slurm_ready(partition: str) -> list[str]:
    """The partition's nodes Slurm can run jobs on now."""
    where = ["-p", partition] if partition else []  # no partition named: the cluster's default one
    out = subprocess.run(["sinfo", "-h", "-N", *where, "-o", "%N %t"], capture_output=True, text=True)
    words = out.stdout.split() if out.returncode == 0 else []
    return sorted({node for node, state in zip(words[0::2], words[1::2], strict=True) if state in READY_STATES})


def wait_for_nodes(
    group: Group,
    nodes: int,
    deadline_s: float,
    *,
    ready=slurm_ready,
    poll_s: float = 5.0,
) -> list[str]:
    """Wait until ``nodes`` of the group's partition are up in Slurm; past ``deadline_s``, a StepError naming the
    group and how many are missing."""
    deadline = time.monotonic() + deadline_s
    while True:
        up = ready(group.partition)
        if len(up) >= nodes:
            return up
        if time.monotonic() >= deadline:
            raise StepError(
                f"group {group.name}: {nodes - len(up)} of the {nodes} node(s) this chain claimed did not come up in "
                f"{deadline_s:.0f} s (up: {', '.join(up) or 'none'}); `hpctl events --group {group.name}` says why. "
                "The release job gives the claim back"
            )
        time.sleep(poll_s)


def release_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.capacity")
    parser.add_argument("action", choices=("release", "wait"))
    parser.add_argument("--claim", help="release: the claim to give back")
    parser.add_argument("--nodes", type=int, default=1, help="wait: the nodes the chain needs up")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    group = group_from_env(env)
    if group is None:
        print("capacity: the partition does not scale with runs; nothing to do")
        return 0
    if args.action == "wait":
        try:
            up = wait_for_nodes(group, args.nodes, float(env.get(WAIT_VARIABLE) or WAIT_DEFAULT_S))
        except StepError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"capacity: {len(up)} node(s) of group {group.name} up: {', '.join(up)}")
        return 0
    if not args.claim:
        parser.error("release needs --claim")
    try:
        gone = release(
            group,
            args.claim,
            make_scaler(env),
            claims_path(env, group),
            busy=slurm_busy,
            drain=slurm_drain,
            own_node=env.get("SLURMD_NODENAME", ""),
        )
    except StepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"capacity: released claim {args.claim}; gave back {', '.join(gone) if gone else 'no node'}")
    return 0


if __name__ == "__main__":
    sys.exit(release_main())
