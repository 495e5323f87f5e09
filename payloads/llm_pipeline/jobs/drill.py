"""The fault drill: inject a fault into a run's running training step, for jobs/recovery.py to recover from.

    python3 -m llm_pipeline.jobs.drill kill-rank --run-dir DIR   # SIGKILL one rank on the step's first node
    python3 -m llm_pipeline.jobs.drill fail-node --run-dir DIR   # Slurm: the step's first node FAIL, then DOWN

Runs on the controller (hpctl drill, through SSM) or beside the local Slurm (the rehearsal). kill-rank reaches the
node with an overlapping step of the job (``srun --overlap``) and kills there a process of the job that torchrun
started (LOCAL_RANK in its environment). fail-node marks the node FAIL (no new jobs) and then DOWN: Slurm kills the
job and requeues it onto the other nodes, and the node stays out of service until an operator resumes it:
``scontrol update nodename=NODE state=resume`` (or hpctl nodes reboot/replace on HyperPod). Each fault is a line in
<run>/logs/recovery.jsonl first, so the figures count from it. Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import pipeline_status, recovery
from llm_pipeline.jobs.chain import PAYLOADS_DIR, slurm
from llm_pipeline.run_files import DRILL, RecoveryLine

DRILL_REASON = "hpl-drill"


class DrillError(PipelineError, RuntimeError):
    """The drill cannot inject its fault; the message says why."""


def running_step(run_dir: Path, step: str) -> tuple[str, str]:
    """(job, its first node) of the run's running ``step``."""
    jobs = [j for j in pipeline_status.read_record(run_dir / "logs") if j.step == step]
    if not jobs:
        raise DrillError(f"{run_dir} has no {step} step in its record (logs/pipeline.json): submit the run first")
    job = jobs[-1].job
    out = slurm(["squeue", "-h", "-j", job, "-o", "%T %N"])
    words = out.stdout.split()
    if out.returncode != 0 or not words or words[0] != "RUNNING":
        raise DrillError(f"step {step} (job {job}) is not running ({' '.join(words) or 'not in squeue'}): try again")
    first = slurm(["scontrol", "show", "hostnames", words[1]]).stdout.split()
    return job, first[0]


def kill_here(job: str) -> str:
    """SIGKILL the lowest-ranked torchrun worker of ``job`` on this host; what was killed."""
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("SLURM_JOB_ID") == job and "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env:
            os.kill(pid, signal.SIGKILL)
            return f"rank {env.get('RANK', '?')} (pid {pid})"
    raise DrillError(f"no torchrun worker of job {job} on this node: is the step still starting?")


def inject(kind: str, run_dir: Path, step: str) -> str:
    job, node = running_step(run_dir, step)
    detail = f"{kind} on {node}"
    recovery.append(run_dir, RecoveryLine(time=time.time(), event=DRILL, step=step, job=job, nodes=node, detail=detail))
    if kind == "kill-rank":
        here = [sys.executable, "-m", "llm_pipeline.jobs.drill", "kill-here", "--job", job]
        out = slurm(
            [
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N1",
                "-n1",
                f"-w{node}",
                f"--export=ALL,PYTHONPATH={PAYLOADS_DIR}",
                *here,
            ]
        )
    else:
        reason = f"reason={DRILL_REASON} {step} job {job}"
        out = slurm(["scontrol", "update", f"nodename={node}", "state=fail", reason])
        if out.returncode == 0:
            out = slurm(["scontrol", "update", f"nodename={node}", "state=down", reason])
    if out.returncode != 0:
        raise DrillError(f"{kind} on {node} failed: {(out.stderr or out.stdout).strip()}")
    said = out.stdout.strip()
    return f"drill: {detail}, job {job}{': ' + said if said else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.drill", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for kind in ("kill-rank", "fail-node"):
        one = sub.add_parser(kind)
        one.add_argument("--run-dir", type=Path, required=True)
        one.add_argument("--step", default="train")
    here = sub.add_parser("kill-here", help="(inside the job's overlapping step) kill one of its ranks")
    here.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "kill-here":
            print(f"killed {kill_here(args.job)}")
        else:
            print(inject(args.command, args.run_dir.resolve(), args.step))
            if args.command == "fail-node":
                print("the node stays out of service: `scontrol update nodename=<node> state=resume` restores it")
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
