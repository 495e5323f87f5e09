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

A claim carries its chain's Slurm job ids (the release job's included) and expires when they are all gone from
Slurm without its release (a scancel of the release job, a node lost under it), or when no job was recorded
``CLAIM_GRACE_S`` after it was made (the submitting session died or sbatch refused the chain). Expiry is checked
whenever the claims file is read under the lock: by the next claim, release or sweep on the group; the file lives on
FSx, so claims survive a controller restart. An expired claim, and a released one whose give-back failed (a refused
drain or delete, throttling or AccessDenied that outlasted the retries) stays in the file, marked released with its
error, until a later give-back on the group succeeds; `hpctl status --slurm` lists them. The sweep
(``sweep --partition P``, run by the admin as root on the controller, docs/teams.md) is a release with no claim of
its own: it expires what is gone and gives back the nodes no live claim needs, which a team user's release job
cannot when Slurm refuses it the drain.

The scaler is HyperPod's BatchAddClusterNodes / BatchDeleteClusterNodes (``HyperPodScaler``) on the cluster;
``HPL_SCALER=module:Class`` names another (the local Slurm's node scaler in tools/local_slurm.py, which takes
nodes up and down with scontrol, for the offline rehearsal).

    python3 -m llm_pipeline.jobs.capacity wait --nodes N        # the chain's first job: its nodes up, or fail
    python3 -m llm_pipeline.jobs.capacity release --claim ID    # the release job's command
    python3 -m llm_pipeline.jobs.capacity sweep --partition P   # the admin's: finish expired and failed claims
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
from dataclasses import asdict, dataclass, field
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
# A claim with no job recorded this long after it was made lost its submission (a dropped session, a refused sbatch).
CLAIM_GRACE_S = 900.0
RELEASE_TRIES = 4  # a failed give-back is tried again after 20 s, 60 s, 180 s (throttling passes; AccessDenied not)
RELEASE_BACKOFF_S = 20.0


class Scaler(Protocol):
    """What capacity needs from whatever adds and removes a group's nodes. A refused or failed call is a StepError
    naming the group and why."""

    def in_service(self, group: str) -> list[str]:
        """The group's nodes Slurm may schedule on (by Slurm node name)."""

    def held(self, group: str) -> int:
        """The nodes that count toward the group's count: in service, coming up, updating, failed and replaced."""

    def add(self, group: str, count: int) -> None:
        """Ask for ``count`` more nodes in the group."""

    def remove(self, group: str, nodes: Sequence[str]) -> dict[str, str]:
        """Give these (drained, idle) nodes back; those not removed, each with why."""


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


@dataclass
class Claim:
    """One chain's claim. Live until its release (or until its chain's jobs are gone from Slurm); a released claim
    whose nodes could not be given back stays, with the error, until a later give-back succeeds."""

    nodes: int
    jobs: list[str] = field(default_factory=list)  # the chain's Slurm job ids, its release job's included
    since: float = 0.0
    released: bool = False
    error: str = ""  # why the last give-back failed (a released claim) or why the claim expired

    @property
    def live(self) -> bool:
        return not self.released


@dataclass
class Claims:
    """The claims file: every chain's claim on the group, and what the last give-back left to report (nodes that
    could not be resumed, deletes HyperPod refused): read by `hpctl status --slurm`."""

    claims: dict[str, Claim] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def live(self) -> dict[str, int]:
        return {key: c.nodes for key, c in self.claims.items() if c.live}


def read_claims(path: Path) -> Claims:
    try:
        return parse_claims(json.loads(path.read_text()))
    except FileNotFoundError:
        return Claims()


def parse_claims(data: Mapping[str, object]) -> Claims:
    claims = {
        # a bare count: a claim written before claims carried their jobs
        str(key): Claim(nodes=value) if isinstance(value, int) else Claim(**value)
        for key, value in dict(data.get("claims", {})).items()
    }
    return Claims(claims=claims, problems=list(data.get("problems", [])))


def failures(data: Mapping[str, object]) -> list[str]:
    """What a claims file says went wrong, one line each: claims released or expired whose nodes are not given back
    yet, and nodes the last give-back could not resume or delete (`hpctl status --slurm` shows them)."""
    claims = parse_claims(data)
    lines = [f"claim {key} ({c.nodes} node(s)): {c.error}" for key, c in claims.claims.items() if c.released]
    return lines + claims.problems


def write_claims(path: Path, claims: Claims) -> None:
    """Write whole, then rename: a reader sees the old file or the new one."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(asdict(claims), indent=1, sort_keys=True))
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


# -- the chains' jobs: a claim lasts while one of them does ------------------------------------------------------------
class JobsAlive(Protocol):
    def __call__(self, jobs: Sequence[str]) -> set[str] | None:
        """Those of ``jobs`` Slurm still knows (pending or running); None when Slurm cannot tell."""


def slurm_alive(jobs: Sequence[str]) -> set[str] | None:
    out = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], capture_output=True, text=True)
    if out.returncode != 0:
        # squeue refuses a list of ids it no longer knows at all: every job is gone
        return set() if "Invalid job id" in out.stderr else None
    return set(out.stdout.split()) & set(jobs)


def expire(claims: Claims, alive: JobsAlive, now: float) -> list[str]:
    """Release the live claims whose chain is gone: every job gone from Slurm, or no job recorded
    ``CLAIM_GRACE_S`` after the claim (the submitting session died before its chain was submitted); the ids."""
    gone = []
    for key, held in claims.claims.items():
        if not held.live:
            continue
        if held.jobs:
            still = alive(held.jobs)
            if still is None or still:
                continue
            why = f"its jobs ({', '.join(held.jobs)}) are gone from Slurm without its release"
        elif now - held.since > CLAIM_GRACE_S:
            why = f"no job was recorded for it {CLAIM_GRACE_S:.0f} s after the claim (the submission died)"
        else:
            continue
        held.released, held.error = True, f"expired: {why}"
        gone.append(key)
    return gone


# -- claim and release ---------------------------------------------------------------------------------------------
def claim(
    group: Group, nodes: int, scaler: Scaler, path: Path, *, alive: JobsAlive = slurm_alive, clock=time.time
) -> str:
    """Record a claim for ``nodes`` and ask for what the live claims need beyond the nodes the group holds; a
    refused or failed add drops the claim and is a StepError naming the group and why."""
    if nodes > group.ceiling:
        raise StepError(
            f"the chain needs {nodes} nodes and group {group.name} scales to at most {group.ceiling} (its count in "
            "cdk.json): raise count, or lower [parallel] nodes"
        )
    claim_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with permission_refusal(path), locked(path):
        claims = read_claims(path)
        expire(claims, alive, clock())
        try:
            held = scaler.held(group.name)  # every node the group holds or is bringing up counts: never past count
            missing = group.wanted({**claims.live(), claim_id: nodes}) - held
            if missing > 0:
                scaler.add(group.name, missing)
        except StepError:
            write_claims(path, claims)  # the expired claims stay expired; this one was never made
            raise
        claims.claims[claim_id] = Claim(nodes=nodes, since=clock())
        write_claims(path, claims)
        record_usage(path, held + max(missing, 0), group.ceiling)
    return claim_id


def record_jobs(path: Path, claim_id: str, jobs: Sequence[str]) -> None:
    """The chain's jobs join its claim: the claim expires once they are all gone from Slurm."""
    with permission_refusal(path), locked(path):
        claims = read_claims(path)
        if claim_id in claims.claims:
            claims.claims[claim_id].jobs += [job for job in jobs if job not in claims.claims[claim_id].jobs]
            write_claims(path, claims)


@dataclass
class GiveBack:
    removed: list[str] = field(default_factory=list)
    error: str = ""  # "": the group is down to what the live claims need (or only busy nodes stand above it)


def release(
    group: Group,
    claim_id: str,
    scaler: Scaler,
    path: Path,
    *,
    busy: BusyCheck,
    drain: DrainNodes,
    resume: DrainNodes,
    own_node: str = "",
    alive: JobsAlive = slurm_alive,
    clock=time.time,
    sleep=time.sleep,
    tries: int = RELEASE_TRIES,
) -> list[str]:
    """Drop the claim and give back the idle nodes no live claim needs, down to the floor; the nodes removed.
    A failed give-back (throttling, AccessDenied, a refused delete, a refused drain) is tried again with backoff,
    the lock let go in between; still failing, the claim stays (released, with the error) for the next claim or
    release on the group to finish, and the StepError names the group and the error."""
    removed: list[str] = []
    for attempt in range(tries):
        with permission_refusal(path), locked(path):
            done = give_back(
                group,
                claim_id,
                scaler,
                path,
                busy=busy,
                drain=drain,
                resume=resume,
                own_node=own_node,
                alive=alive,
                clock=clock,
            )
        removed += done.removed
        if not done.error:
            return removed
        if attempt + 1 < tries:
            print(
                f"capacity: group {group.name}: {done.error}; trying again (try {attempt + 2} of {tries})",
                file=sys.stderr,
                flush=True,
            )
            sleep(RELEASE_BACKOFF_S * 3**attempt)
    raise StepError(
        f"group {group.name}: could not give back the nodes of claim {claim_id} after {tries} tries: {done.error}. "
        "The claim stays (released) and the next claim or release on the group tries again; "
        "`hpctl status --slurm` lists it"
    )


def give_back(
    group: Group,
    claim_id: str,
    scaler: Scaler,
    path: Path,
    *,
    busy: BusyCheck,
    drain: DrainNodes,
    resume: DrainNodes,
    own_node: str = "",
    alive: JobsAlive = slurm_alive,
    clock=time.time,
) -> GiveBack:
    """Under the lock: mark the claim released, then bring the group down to what the live claims need. Released
    claims are dropped only once that succeeded; a node that got a job while being drained is resumed, and so is
    every drained node whose delete failed or was refused."""
    claims = read_claims(path)
    expire(claims, alive, clock())
    if claim_id in claims.claims:
        claims.claims[claim_id].released = True
    problems: list[str] = []
    result = GiveBack()
    try:
        up = scaler.in_service(group.name)
        surplus = scaler.held(group.name) - group.wanted(claims.live())
        chosen = idle_first(up, own_node, busy)[: max(surplus, 0)]
        if chosen:
            drain(chosen)  # nothing new starts there; what started meanwhile keeps its node
            landed = [node for node in chosen if busy(node, ignore_own=node == own_node)]
            gone = [node for node in chosen if node not in landed]
            resumed(landed, resume, problems, "got a job while being drained")
            refused: dict[str, str] = {}
            try:
                refused = scaler.remove(group.name, gone) if gone else {}
            except StepError:
                resumed(gone, resume, problems, "its delete failed")
                raise
            result.removed = [node for node in gone if node not in refused]
            for node, why in refused.items():
                problems.append(f"{node}: delete refused ({why})")
            resumed(list(refused), resume, problems, "its delete was refused")
            if refused:
                result.error = "delete refused for " + "; ".join(f"{node}: {why}" for node, why in refused.items())
            if result.removed:
                record_usage(path, len(up) - len(result.removed), group.ceiling)
    except StepError as error:
        result.error = str(error)
    for key in [key for key, held in claims.claims.items() if held.released]:
        if result.error:
            claims.claims[key].error = result.error
        else:
            del claims.claims[key]
    claims.problems = problems
    write_claims(path, claims)
    return result


def idle_first(up: Sequence[str], own_node: str, busy: BusyCheck) -> list[str]:
    """The idle nodes, the release job's own node last (it runs nothing else): the chain's nodes go back."""
    idle = [node for node in up if node != own_node and not busy(node)]
    if own_node in up and not busy(own_node, ignore_own=True):
        idle.append(own_node)
    return idle


def resumed(nodes: list[str], resume: DrainNodes, problems: list[str], why: str) -> list[str]:
    """Resume drained nodes that stay in the group; one that cannot be resumed is reported, not left silent."""
    if not nodes:
        return []
    try:
        resume(nodes)
    except StepError as error:
        problems.append(f"{', '.join(nodes)} left drained ({why}): {error}")
    return nodes


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


def slurm_node_state(nodes: Sequence[str], state: str) -> None:
    """``scontrol update`` the nodes' state; Slurm refuses it to a user who is not a Slurm operator or admin (a
    team user's release job on HyperPod): a StepError naming the nodes and Slurm's answer, so nothing is removed
    undrained."""
    extra = ["reason=hpl-capacity-release"] if state == "drain" else []
    out = subprocess.run(
        ["scontrol", "update", f"nodename={','.join(nodes)}", f"state={state}", *extra], capture_output=True, text=True
    )
    if out.returncode != 0:
        said = " ".join((out.stderr or out.stdout).split()) or f"exit {out.returncode}"  # one line
        raise StepError(
            f"Slurm refused to {state} {', '.join(nodes)} ({said}): "
            "`scontrol update` needs a Slurm operator or admin: the admin gives the nodes back as root on the "
            "controller (`python3 -m llm_pipeline.jobs.capacity sweep --partition <partition>`, docs/teams.md)"
        )


def slurm_drain(nodes: Sequence[str]) -> None:
    slurm_node_state(nodes, "drain")


def slurm_resume(nodes: Sequence[str]) -> None:
    slurm_node_state(nodes, "resume")


# -- scalers -----------------------------------------------------------------------------------------------------
# What each ClusterInstanceStatus (botocore's model) means for the group's count: every status but those of a node
# on its way out holds an instance of the group's target count, so a claim counts it and never adds past count.
HELD, LEAVING = "held", "leaving"
INSTANCE_STATUSES = {
    "Running": HELD,
    "Pending": HELD,  # coming up
    "AttachInProgress": HELD,  # coming up
    "DeepHealthCheckInProgress": HELD,  # coming up, its checks running
    "SystemUpdating": HELD,  # up, being patched
    "Failure": HELD,  # HyperPod replaces it in place: its slot stays taken
    "ShuttingDown": LEAVING,
    "DetachInProgress": LEAVING,
    "NotFound": LEAVING,
}
SCHEDULABLE_STATUS = "Running"  # only a running node is a Slurm node a release may drain and give back


class HyperPodScaler:
    """HyperPod's node APIs (continuous provisioning): BatchAddClusterNodes raises a group's target count,
    BatchDeleteClusterNodes removes nodes by instance id. Slurm names HyperPod nodes by private DNS host name
    (ip-10-1-2-3), which ListClusterNodes reports beside each instance id. Both batch calls answer HTTP 200 with a
    ``Failed`` list for what they refused: it is read, never taken for success; an AWS error (throttling,
    AccessDenied) is a StepError naming the call and the group."""

    MAX_ADD = 50  # AddClusterNodeSpecification.IncrementTargetCountBy's maximum (botocore's model)

    def __init__(self, cluster: str, client: object | None = None) -> None:
        if client is None:
            import boto3  # in the training images and on HyperPod's AMI; only the scaler needs it

            client = boto3.client("sagemaker")
        self.cluster = cluster
        self.client = client

    @contextlib.contextmanager
    def _call(self, what: str, group: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as error:
            code, message = error.response["Error"].get("Code", "?"), error.response["Error"].get("Message", "")
            raise StepError(f"{what} for group {group} of cluster {self.cluster} failed: {code}: {message}") from error
        except BotoCoreError as error:
            raise StepError(f"{what} for group {group} of cluster {self.cluster} failed: {error}") from error

    def _nodes(self, group: str) -> list[dict]:
        found: list[dict] = []
        token = None
        with self._call("ListClusterNodes", group):
            while True:
                page = self.client.list_cluster_nodes(
                    ClusterName=self.cluster,
                    InstanceGroupNameContains=group,
                    **({"NextToken": token} if token else {}),
                )
                found += [n for n in page["ClusterNodeSummaries"] if n["InstanceGroupName"] == group]
                token = page.get("NextToken")
                if not token:
                    return found

    def in_service(self, group: str) -> list[str]:
        return [
            short_host(n.get("PrivateDnsHostname", ""))
            for n in self._nodes(group)
            if n["InstanceStatus"]["Status"] == SCHEDULABLE_STATUS
        ]

    def held(self, group: str) -> int:
        # a status the table does not know yet counts as held: the safe side of count
        return sum(INSTANCE_STATUSES.get(n["InstanceStatus"]["Status"], HELD) == HELD for n in self._nodes(group))

    def add(self, group: str, count: int) -> None:
        while count > 0:
            step = min(count, self.MAX_ADD)
            with self._call("BatchAddClusterNodes", group):
                reply = self.client.batch_add_cluster_nodes(
                    ClusterName=self.cluster, NodesToAdd=[{"InstanceGroupName": group, "IncrementTargetCountBy": step}]
                )
            refused = [
                f"{f['ErrorCode']}: {f.get('Message', '')} ({f['FailedCount']} node(s))".replace(":  (", " (")
                for f in reply.get("Failed", [])
            ]
            if refused:
                raise StepError(
                    f"HyperPod refused to add nodes to group {group} of cluster {self.cluster}: {'; '.join(refused)}; "
                    f"`hpctl events --group {group}` and `hpctl status` say more"
                )
            count -= step

    def remove(self, group: str, nodes: Sequence[str]) -> dict[str, str]:
        ids = {short_host(n.get("PrivateDnsHostname", "")): n["InstanceId"] for n in self._nodes(group)}
        unknown = {node: "NodeIdNotFound: not listed by ListClusterNodes" for node in nodes if node not in ids}
        wanted = [ids[node] for node in nodes if node in ids]
        if not wanted:
            return unknown
        with self._call("BatchDeleteClusterNodes", group):
            reply = self.client.batch_delete_cluster_nodes(ClusterName=self.cluster, NodeIds=wanted)
        names = {instance: node for node, instance in ids.items()}
        failed = {names.get(f["NodeId"], f["NodeId"]): f"{f['Code']}: {f['Message']}" for f in reply.get("Failed", [])}
        # Only what the reply names as deleted is: a node it names in neither list is not booked as removed.
        confirmed = {names.get(instance, instance) for instance in reply.get("Successful", [])}
        silent = {ids[node]: "not in the reply's Successful list" for node in nodes if node in ids}
        missing = {names[i]: why for i, why in silent.items() if names[i] not in confirmed and names[i] not in failed}
        return {**unknown, **failed, **missing}


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


def sweep_environment(env: Mapping[str, str], partition: str) -> dict[str, str]:
    """The release job's environment for ``partition``, from the deploy's partition facts: what an admin's sweep on
    the controller needs (it runs outside any chain)."""
    from llm_pipeline.jobs import deploy_facts

    known, _ = deploy_facts.read_partitions(Path(__file__).resolve().parents[2])
    if partition not in known:
        raise StepError(f"no partition {partition} in the deploy's facts (partitions: {', '.join(sorted(known))})")
    return {**env, "HPL_PARTITION": partition, **scaling_environment(known[partition])}


def release_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.capacity")
    parser.add_argument("action", choices=("release", "wait", "sweep"))
    parser.add_argument("--claim", help="release: the claim to give back")
    parser.add_argument("--nodes", type=int, default=1, help="wait: the nodes the chain needs up")
    parser.add_argument("--partition", help="sweep: the scaled partition whose expired or pending claims to finish")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.action == "sweep":
            if not args.partition:
                parser.error("sweep needs --partition")
            env = sweep_environment(env, args.partition)
        group = group_from_env(env)
        if group is None:
            print("capacity: the partition does not scale with runs; nothing to do")
            return 0
        if args.action == "wait":
            up = wait_for_nodes(group, args.nodes, float(env.get(WAIT_VARIABLE) or WAIT_DEFAULT_S))
            print(f"capacity: {len(up)} node(s) of group {group.name} up: {', '.join(up)}")
            return 0
        if args.action == "release" and not args.claim:
            parser.error("release needs --claim")
        gone = release(
            group,
            args.claim or "",  # a sweep releases no claim of its own: expired and pending ones only
            make_scaler(env),
            claims_path(env, group),
            busy=slurm_busy,
            drain=slurm_drain,
            resume=slurm_resume,
            own_node=env.get("SLURMD_NODENAME", "") if args.claim else "",
        )
    except StepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    what = f"released claim {args.claim}" if args.claim else f"swept group {group.name}"
    print(f"capacity: {what}; gave back {', '.join(gone) if gone else 'no node'}")
    return 0


if __name__ == "__main__":
    sys.exit(release_main())
