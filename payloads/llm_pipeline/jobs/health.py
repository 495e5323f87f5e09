"""The health gate: a short check of every node of a multi-node step's allocation before the step trains on it.

The step's batch script calls ``gate`` first (env.sh ``hpl_health_gate``). It runs the per-node checks of the
partition's accelerator on each node (``srun --ntasks-per-node=1 ... node``), then the across-node all-reduce where
the accelerator has one, and records every node's result with the checks' version and the image. A node that
failed is drained with ``HealthCheck:Failed <check>: <why>`` (or handed to HyperPod to reboot or replace:
train.health_node_action), the step asks Slurm to requeue it without that node, and it starts again on healthy
nodes. A failed all-reduce names no node: the step fails with one error line. docs/operations.md says why this is
the chain's own step and not a Slurm prolog.

    python3 -m llm_pipeline.jobs.health gate   # in a step's batch script (env.sh)
    python3 -m llm_pipeline.jobs.health node   # on one node (the gate's srun)
Stdlib only (the node's python3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llm_pipeline.config import HEALTH_CHECKS
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs.run_facts import read_run_facts

# Bumped with any change to a check, its command or its threshold; recorded with each result (the checks ship in
# the payloads, beside the image URI each result also records).
CHECKS_VERSION = "health-1"
PASSED, FAILED = "HealthCheck:Passed", "HealthCheck:Failed"
RESULTS_DIR = "health"  # <run>/logs/health/<job>-<node>.json: one node's result
RESULTS_FILE = "health.jsonl"  # <run>/logs/health.jsonl: every gate's verdict per node
REQUEUED_EXIT = 4  # the gate asked Slurm to requeue the step without the failed nodes
CHECK_TIMEOUT_S = 300  # DCGM's level 1 lasts seconds; a hung tool is a failed check, not a hung step
REASON_LIMIT = 200  # characters of a Slurm drain reason we write
HYPERPOD_DIR = "/opt/sagemaker_cluster"  # as env.sh: its presence means a HyperPod node

# What runs where, by the partition's accelerator (HPL_ACCELERATOR).
PER_NODE = {"cuda": ("nvidia-smi", "dcgm-diag"), "neuron": ("neuron-ls", "neuron-memory", "nccom-all-reduce")}
ACROSS_NODES = {"cuda": ("nccl-all-reduce",)}
# What HyperPod's Slurm integration reads in a failed node's reason (train.health_node_action).
NODE_ACTIONS = {"reboot": "Action:Reboot", "replace": "Action:Replace"}


class HealthError(PipelineError, RuntimeError):
    """The gate cannot run (no run config, no node list): one line."""


# -- parsing each tool's output: '' when healthy, else why not ---------------------------------------------------
def parse_nvidia_smi(out: str, rc: int, expected: int) -> str:
    """``nvidia-smi --query-gpu=index,name,memory.total,ecc.errors.uncorrected.volatile.total
    --format=csv,noheader,nounits``: one line per GPU; [N/A] where ECC is off."""
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    if any(len(row) != 4 for row in rows):
        return f"unexpected output: {last_line(out)}"
    if expected and len(rows) != expected:
        return f"{len(rows)} of {expected} GPUs"
    bad = [f"GPU {row[0]} {row[3]} uncorrected ECC errors" for row in rows if row[3].isdigit() and int(row[3]) > 0]
    return "; ".join(bad)


_DCGM_ROW = re.compile(r"^\|\s*([^|]*?)\s*\|\s*(Pass|Fail|Warn|Skip)\w*", re.IGNORECASE)


def parse_dcgm_diag(out: str, rc: int) -> str:
    """``dcgmi diag -r 1``: a table of tests (``| <test> | Pass |``); a failed test reads Fail, and dcgmi exits
    non-zero (the dcgmi diag reference's exit status)."""
    failed = [m.group(1) for line in out.splitlines() if (m := _DCGM_ROW.match(line)) and m.group(2).lower() == "fail"]
    if failed:
        return "failed: " + ", ".join(failed)
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    if not any(_DCGM_ROW.match(line) for line in out.splitlines()):
        return f"no test results: {last_line(out)}"
    return ""


def neuron_devices(out: str) -> list[dict]:
    """``neuron-ls --json-output``: a list with one object per Neuron device (nc_count, memory_size in bytes)."""
    try:
        devices = json.loads(out)
    except json.JSONDecodeError:
        return []
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def parse_neuron_ls(out: str, rc: int, expected_cores: int) -> str:
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    devices = neuron_devices(out)
    if not devices:
        return f"no Neuron device listed: {last_line(out)}"
    cores = sum(int(d.get("nc_count", 0)) for d in devices)
    if expected_cores and cores < expected_cores:
        return f"{cores} NeuronCores on {len(devices)} devices, {expected_cores} expected"
    return ""


def parse_neuron_memory(out: str, rc: int) -> str:
    """Every device reports the same, non-zero device memory (a device whose memory is missing or smaller is bad)."""
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    sizes = [int(d.get("memory_size", 0)) for d in neuron_devices(out)]
    if not sizes:
        return f"no Neuron device listed: {last_line(out)}"
    short = [str(i) for i, size in enumerate(sizes) if size <= 0 or size < max(sizes)]
    return f"device(s) {', '.join(short)} report less memory than {max(sizes)} bytes" if short else ""


_BUS_BANDWIDTH = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)", re.IGNORECASE)


def parse_nccom_test(out: str, rc: int) -> str:
    """``nccom-test -r N allr``: a table of sizes and bandwidths, then ``Avg bus bandwidth: <x>GB/s``."""
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    found = _BUS_BANDWIDTH.search(out)
    if not found or float(found.group(1)) <= 0:
        return f"no bus bandwidth reported: {last_line(out)}"
    return ""


_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)", re.IGNORECASE)


def parse_nccl_tests(out: str, rc: int) -> str:
    """nccl-tests' ``all_reduce_perf``: a table, then ``# Out of bounds values : 0 OK`` and
    ``# Avg bus bandwidth : <x>``; a wrong sum counts out-of-bounds values."""
    if rc != 0:
        return f"exit {rc}: {last_line(out)}"
    wrong = _OUT_OF_BOUNDS.search(out)
    if not wrong:
        return f"no result summary: {last_line(out)}"
    if int(wrong.group(1)):
        return f"{wrong.group(1)} wrong values after the all-reduce"
    return parse_nccom_test(out, rc)  # the same bandwidth line


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:120] if lines else "no output"


# -- the checks ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    command: Callable[[int], list[str]]  # from the devices per node
    verdict: Callable[[str, int, int], str]  # (output, exit code, devices per node) -> '' or why not


NEURON_LS = ["neuron-ls", "--json-output"]
CHECKS: dict[str, Check] = {
    "nvidia-smi": Check(
        lambda _: [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,ecc.errors.uncorrected.volatile.total",
            "--format=csv,noheader,nounits",
        ],
        parse_nvidia_smi,
    ),
    "dcgm-diag": Check(lambda _: ["dcgmi", "diag", "-r", "1"], lambda out, rc, _: parse_dcgm_diag(out, rc)),
    "neuron-ls": Check(lambda _: NEURON_LS, parse_neuron_ls),
    "neuron-memory": Check(lambda _: NEURON_LS, lambda out, rc, _: parse_neuron_memory(out, rc)),
    # One rank per NeuronCore of this node (at least 2: a collective needs two).
    "nccom-all-reduce": Check(
        lambda devices: ["nccom-test", "-r", str(max(devices, 2)), "allr"], lambda out, rc, _: parse_nccom_test(out, rc)
    ),
    # srun starts one per node; each drives its node's GPUs (-g), NCCL joining them over EFA.
    "nccl-all-reduce": Check(
        lambda devices: ["all_reduce_perf", "-b", "8M", "-e", "8M", "-g", str(max(devices, 1))],
        lambda out, rc, _: parse_nccl_tests(out, rc),
    ),
}
assert set(CHECKS) == set(HEALTH_CHECKS), "config.HEALTH_CHECKS names the checks of jobs/health.py"


@dataclass
class CheckResult:
    name: str
    ok: bool
    reason: str = ""
    seconds: float = 0.0


@dataclass
class NodeResult:
    node: str
    job: str
    step: str
    version: str = CHECKS_VERSION
    image: str = ""
    time: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)

    def reason(self) -> str:
        failed = [f"{c.name}: {c.reason}" for c in self.checks if not c.ok]
        return f"{FAILED} " + "; ".join(failed) + f" ({self.version})" if failed else f"{PASSED} ({self.version})"

    @classmethod
    def load(cls, path: Path) -> NodeResult:
        raw = json.loads(path.read_text())
        checks = [CheckResult(**c) for c in raw.pop("checks", [])]
        raw.pop("passed", None)
        return cls(**raw, checks=checks)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "passed": self.passed}, sort_keys=True)


def run_check(name: str, devices: int) -> CheckResult:
    check = CHECKS[name]
    argv = check.command(devices)
    started = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        reason = check.verdict(out.stdout + out.stderr, out.returncode, devices)
    except FileNotFoundError:
        reason = f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        reason = f"{argv[0]} did not answer within {CHECK_TIMEOUT_S} s"
    return CheckResult(name, not reason, reason, round(time.monotonic() - started, 2))


def chosen_checks(accelerator: str, skip: Sequence[str]) -> tuple[list[str], list[str]]:
    """(per-node checks, across-node checks) of the accelerator, less those the run skips by name."""
    return (
        [name for name in PER_NODE.get(accelerator, ()) if name not in skip],
        [name for name in ACROSS_NODES.get(accelerator, ()) if name not in skip],
    )


# -- the gate ------------------------------------------------------------------------------------------------
def slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True)


def hostnames(nodelist: str) -> list[str]:
    out = slurm(["scontrol", "show", "hostnames", nodelist])
    if out.returncode != 0:
        raise HealthError(f"cannot expand the job's node list {nodelist!r}: {last_line(out.stderr)}")
    return out.stdout.split()


def results_dir(run_dir: Path) -> Path:
    return run_dir / "logs" / RESULTS_DIR


def node_main(run_dir: Path, job: str, step: str, checks: Sequence[str], devices: int) -> int:
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    result = NodeResult(node, job, step, image=os.environ.get("HPL_IMAGE_URI", ""), time=time.time())
    result.checks = [run_check(name, devices) for name in checks]
    folder = results_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job}-{node}.json"
    path.with_suffix(".tmp").write_text(result.to_json() + "\n")
    path.with_suffix(".tmp").replace(path)
    return 0


def mark_failed(nodes: dict[str, str], action: str) -> list[str]:
    """Drain each failed node with its reason, or fail it for HyperPod to reboot or replace; what Slurm refused."""
    refused = []
    for node, reason in nodes.items():
        prefix = NODE_ACTIONS.get(action)
        state, text = ("fail", f"{prefix} {reason}") if prefix else ("drain", reason)
        out = slurm(["scontrol", "update", f"nodename={node}", f"state={state}", f"reason={text[:REASON_LIMIT]}"])
        if out.returncode != 0:
            refused.append(f"{node} ({last_line(out.stderr or out.stdout)})")
    return refused


def requeue_without(job: str, nodes: Sequence[str]) -> str:
    """Requeue this job, then keep it off ``nodes`` (Slurm takes an exclusion on a pending job only: its owner may
    set it). The requeue signals this job's processes: ignored here until both calls are made."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = slurm(["scontrol", "requeue", job])
    if out.returncode != 0:
        return f"requeue refused: {last_line(out.stderr or out.stdout)}"
    out = slurm(["scontrol", "update", f"jobid={job}", f"excnodelist={','.join(nodes)}"])
    return "" if out.returncode == 0 else f"exclusion refused: {last_line(out.stderr or out.stdout)}"


def failed_before(run_dir: Path, job: str) -> list[str]:
    """Every node a gate of this job has failed, this one's included (an exclusion replaces the job's last one)."""
    path = run_dir / "logs" / RESULTS_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return list(dict.fromkeys(line["node"] for line in lines if line.get("job") == job and line.get("verdict")))


def gate_enabled(env: dict[str, str]) -> bool:
    """On HyperPod; elsewhere only where asked (HPL_HEALTH_GATE=1: the local Slurm's rehearsal of it)."""
    return env.get("HPL_HEALTH_GATE") == "1" or Path(env.get("HPL_SAGEMAKER_CLUSTER_DIR") or HYPERPOD_DIR).is_dir()


def gate_main(env: dict[str, str]) -> int:
    if not gate_enabled(env):
        return 0
    started = time.monotonic()
    run_dir, job, step = Path(env["HPL_RUN_DIR"]), env.get("SLURM_JOB_ID", "none"), env.get("HPL_CHAIN_STEP", "")
    run = read_run_facts(env["HPL_RUN_CONFIG"]).run
    train = getattr(run, "train", None)  # a ladder's config trains through torchtitan: the defaults
    skip = train.health_skip if train else ()
    action = train.health_node_action if train else "drain"
    devices = int(env.get("HPL_DEVICES_PER_NODE") or 0)
    per_node, across = chosen_checks(env.get("HPL_ACCELERATOR", ""), skip)
    nodes = hostnames(env.get("SLURM_JOB_NODELIST", ""))
    for stale in results_dir(run_dir).glob(f"{job}-*.json"):  # an earlier start of this job (a requeue)
        stale.unlink()
    if per_node:
        command = [sys.executable, "-m", "llm_pipeline.jobs.health", "node", "--checks", ",".join(per_node)]
        slurm(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", *command])
    results = {}
    for node in nodes:
        path = results_dir(run_dir) / f"{job}-{node}.json"
        results[node] = NodeResult.load(path) if path.is_file() else None
    if not per_node:
        results = {node: NodeResult(node, job, step, time=time.time()) for node in nodes}
    failed = {
        node: (r.reason() if r else f"{FAILED} no result from the node's checks ({CHECKS_VERSION})")
        for node, r in results.items()
        if not r or not r.passed
    }
    with open(run_dir / "logs" / RESULTS_FILE, "a", encoding="utf-8") as out:
        for node, result in results.items():
            line = json.loads(result.to_json()) if result else {"node": node, "job": job, "passed": False}
            out.write(json.dumps({**line, "step": step, "verdict": failed.get(node, "")}, sort_keys=True) + "\n")
    seconds = round(time.monotonic() - started, 1)
    if failed:
        for node, reason in failed.items():
            print(f"== health gate: {node} {reason}", flush=True)
        refused = mark_failed(failed, action)
        if refused:
            print(f"== health gate: Slurm refused to mark {', '.join(refused)}: excluded from this job only")
        problem = requeue_without(job, failed_before(run_dir, job))
        if problem:
            print(f"error: health gate: {', '.join(failed)} failed and this job could not move ({problem})")
            return 1
        print(f"== health gate: job {job} requeued without {','.join(failed)} after {seconds} s", flush=True)
        return REQUEUED_EXIT
    for name in across:
        argv = [*CHECKS[name].command(devices)]
        out = slurm(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *argv])
        reason = CHECKS[name].verdict(out.stdout + out.stderr, out.returncode, devices)
        if reason:
            print(f"error: health gate: {name} across {','.join(nodes)} failed ({reason}); no node is to blame alone")
            return 1
    print(f"== health gate: {','.join(nodes)} {PASSED} ({CHECKS_VERSION}) in {seconds} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.health", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("gate", help="check the job's nodes; exit 4: requeued without the failed ones")
    node = sub.add_parser("node", help="run this node's checks and write its result")
    node.add_argument("--checks", required=True, help="comma-separated check names")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.command == "node":
            checks = [name for name in args.checks.split(",") if name]
            devices = int(env.get("HPL_DEVICES_PER_NODE") or 0)
            job = env.get("SLURM_JOB_ID", "none")
            return node_main(Path(env["HPL_RUN_DIR"]), job, env.get("HPL_CHAIN_STEP", ""), checks, devices)
        return gate_main(env)
    except HealthError as exc:
        print(f"error: health gate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
