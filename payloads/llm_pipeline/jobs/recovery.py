"""Automatic recovery of a training step on Slurm: each attempt, what failed, whether to start again, the figures.

train.sbatch runs the training in a loop: ``attempt`` before each start (it refuses one more than
train.max_recoveries), ``failed`` after a failed one (exit 0: start again in this allocation from the newest
complete checkpoint). A lost node ends the allocation instead: Slurm requeues the job (``--requeue``) onto healthy
nodes, and its next ``attempt`` finds the earlier one ended without a word and asks Slurm what became of its nodes.
Every event is a line in <run>/logs/recovery.jsonl (``RecoveryLine``; the drill adds the faults it injects), each
recovery raises a ``recovered`` alert (jobs/alerts.py), and ``report`` writes the figures to
<run>/logs/recovery.json as the step ends: time to detect, time to resume, steps lost, and the replayed loss.

A failure whose log part holds an error line of our own (``error: ...``: a refused key, a NaN stop) would fail
again: it is not retried. Every other failure (a rank killed, a node lost, a collective that hung) is.

    python3 -m llm_pipeline.jobs.recovery attempt|failed --exit RC|report   # train.sbatch
Stdlib only (the node's python3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline.jobs import alerts
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.run_files import (
    ATTEMPT,
    CHECKPOINT,
    DRILL,
    FAILURE,
    RECOVERY_FILE,
    RECOVERY_REPORT,
    RESUMING_FROM,
    BackendLine,
    ProgressLine,
    RecoveryLine,
    StepLog,
)

RECOVERED = "recovered"  # the alert state
GIVE_UP_EXIT = 3
# What a failed attempt's log says of its cause, first match wins: torchrun's summary of a rank killed by a signal,
# Slurm's word on a lost node, srun's last error.
_CAUSES = (
    re.compile(r"Signal \d+ \(\w+\) received by PID \d+"),
    re.compile(r"CANCELLED AT \S+ DUE TO NODE FAILURE"),
    re.compile(r"srun: error: .*"),
)


def recovery_file(run_dir: Path) -> Path:
    return run_dir / "logs" / RECOVERY_FILE


def read_lines(run_dir: Path) -> list[RecoveryLine]:
    path = recovery_file(run_dir)
    return RecoveryLine.parse_all(path.read_text(errors="replace")) if path.is_file() else []


def append(run_dir: Path, line: RecoveryLine) -> None:
    path = recovery_file(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(line.to_json())


def step_lines(run_dir: Path, step: str, job: str) -> list[RecoveryLine]:
    return [line for line in read_lines(run_dir) if line.step == step and line.job == job]


def log_parts(log_text: str, attempts: list[RecoveryLine]) -> list[str]:
    """Each attempt's part of the step log (the log is appended to across attempts and requeues)."""
    ends = [a.offset for a in attempts[1:]] + [len(log_text)]
    return [log_text[a.offset : end] for a, end in zip(attempts, ends, strict=True)]


def cause(log_part: str, exit_code: int) -> str:
    for pattern in _CAUSES:
        found = pattern.findall(log_part)
        if found:
            return found[-1].strip()
    return f"exit {exit_code}"


def own_error(log_part: str) -> str:
    """Our one-line error (a refusal, the loss guard's NaN stop) in an attempt's log part, or ''."""
    found = [line for line in log_part.splitlines() if line.startswith("error: ")]
    return found[-1] if found else ""


def node_states(nodes: str) -> str:
    """What Slurm says of an attempt's nodes: ``node1 fail (drill)``; '' where it cannot tell."""
    out = subprocess.run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N %t %E"], capture_output=True, text=True)
    if out.returncode != 0:
        return ""
    return "; ".join(
        dict.fromkeys(  # a node in several partitions is listed once per partition
            f"{parts[0]} {parts[1]}" + (f" ({' '.join(parts[2:])})" if len(parts) > 2 and parts[2] != "none" else "")
            for parts in (line.split() for line in out.stdout.splitlines())
            if parts
        )
    )


def requeued_at(job: str) -> float | None:
    """When Slurm requeued ``job`` (its SubmitTime, reset by a requeue), or None."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
    found = re.search(r"SubmitTime=(\S+)", out.stdout) if out.returncode == 0 else None
    if not found:
        return None
    try:
        return time.mktime(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))  # scontrol prints local time
    except ValueError:
        return None


def start_attempt(
    run_dir: Path, step: str, job: str, nodes: str, max_recoveries: int, *, now: float | None = None
) -> int:
    """Record an attempt; 0 to go on, GIVE_UP_EXIT past max_recoveries. A later attempt raises a recovered alert."""
    now = time.time() if now is None else now
    mine = step_lines(run_dir, step, job)
    attempts = [line for line in mine if line.event == ATTEMPT]
    number = len(attempts) + 1
    what = ""
    if attempts:
        failures = [line for line in mine if line.event == FAILURE and line.time >= attempts[-1].time]
        what = failures[0].detail if failures else ""
        if not failures:  # lost with its allocation: Slurm requeued the job
            states = node_states(attempts[-1].nodes)
            what = f"requeued by Slurm after attempt {len(attempts)} on {attempts[-1].nodes}" + (
                f": {states}" if states else ""
            )
            # Slurm's requeue stamps the job's SubmitTime: the moment the loss was detected.
            detected = requeued_at(job) or now
            append(
                run_dir,
                RecoveryLine(time=detected, event=FAILURE, step=step, job=job, attempt=len(attempts), detail=what),
            )
    if number - 1 > max_recoveries:
        print(
            f"error: step {step} (job {job}) failed {number - 1} times, more than train.max_recoveries = "
            f"{max_recoveries}: see {recovery_file(run_dir)}, fix the cause, then submit --from {step} again",
            file=sys.stderr,
        )
        return GIVE_UP_EXIT
    log = run_dir / "logs" / StepLog(step, job).name
    offset = log.stat().st_size if log.is_file() else 0
    append(
        run_dir, RecoveryLine(time=now, event=ATTEMPT, step=step, job=job, attempt=number, nodes=nodes, offset=offset)
    )
    if number > 1:
        detail = f"attempt {number} of {max_recoveries + 1} resumes from the newest complete checkpoint after: {what}"
        alerts.raise_alert(RECOVERED, run_dir=run_dir, step=step, job=job, detail=detail)
    return 0


def attempt_failed(run_dir: Path, step: str, job: str, exit_code: int, max_recoveries: int) -> bool:
    """Record what failed; True: start again (within max_recoveries, and not a failure of our own)."""
    mine = step_lines(run_dir, step, job)
    attempts = [line for line in mine if line.event == ATTEMPT]
    log = run_dir / "logs" / StepLog(step, job).name
    text = log.read_text(errors="replace") if log.is_file() else ""
    part = log_parts(text, attempts)[-1] if attempts else text
    error = own_error(part)
    detail = error.removeprefix("error: ") if error else cause(part, exit_code)
    append(
        run_dir,
        RecoveryLine(
            time=time.time(), event=FAILURE, step=step, job=job, attempt=len(attempts), exit=exit_code, detail=detail
        ),
    )
    again = not error and len(attempts) <= max_recoveries
    why = "a failure of its own: not retried" if error else ("retrying" if again else "no recoveries left")
    print(f"== {step} attempt {len(attempts)} failed ({detail}): {why}", flush=True)
    return again


def figures(run_dir: Path, step: str, job: str) -> list[dict]:
    """One row per recovery: the fault (a drill's, where one was injected), when it was detected and the training
    resumed (seconds after the fault), the steps lost (trained but not in the checkpoint resumed from), and the
    largest difference of a replayed step's loss from the same step before the fault."""
    mine = step_lines(run_dir, step, job)
    attempts = [line for line in mine if line.event == ATTEMPT]
    log = run_dir / "logs" / StepLog(step, job).name
    parts = log_parts(log.read_text(errors="replace") if log.is_file() else "", attempts)
    drills = [line for line in read_lines(run_dir) if line.event == DRILL and line.job == job]
    rows = []
    for index in range(len(attempts) - 1):
        before, after = attempts[index], attempts[index + 1]
        failures = [f for f in mine if f.event == FAILURE and before.time <= f.time <= after.time]
        faults = [d for d in drills if before.time <= d.time <= after.time]
        detected = failures[0].time if failures else after.time
        fault_time = faults[0].time if faults else detected
        detected = max(detected, fault_time)  # Slurm's requeue time has whole seconds: not before the fault
        losses = {p.step: p.loss for p in ProgressLine.parse_all(parts[index])}
        replayed = {p.step: p.loss for p in ProgressLine.parse_all(parts[index + 1])}
        resumed_from = resumed_step(parts[index + 1])
        common = sorted(set(losses) & set(replayed))
        rows.append(
            {
                "attempt": after.attempt,
                "fault": faults[0].detail if faults else "",
                "failed": "; ".join(f.detail for f in failures),
                "nodes_before": before.nodes,
                "nodes_after": after.nodes,
                "time_to_detect_s": round(detected - fault_time, 1),
                "time_to_resume_s": round(after.time - fault_time, 1),
                "last_step_before": max(losses, default=0),
                "resumed_from_step": resumed_from,
                "steps_lost": max(0, max(losses, default=0) - resumed_from),
                "first_step_after": min(replayed, default=0),
                "replayed_loss_max_diff": max((abs(losses[s] - replayed[s]) for s in common), default=None),
            }
        )
    return rows


def write_report(run_dir: Path, step: str, job: str) -> Path:
    rows = figures(run_dir, step, job)
    path = run_dir / "logs" / RECOVERY_REPORT
    path.write_text(json.dumps({"step": step, "job": job, "recoveries": rows}, indent=2) + "\n")
    for row in rows:
        print(
            f"== recovery {row['attempt'] - 1}: {row['failed']}: detected after {row['time_to_detect_s']} s, "
            f"resumed after {row['time_to_resume_s']} s, {row['steps_lost']} steps lost "
            f"(resumed from step {row['resumed_from_step']}, first step {row['first_step_after']})",
            flush=True,
        )
    return path


def resumed_step(log: str) -> int:
    """The checkpoint step an attempt's training resumed from (its backend line; run_files), 0 from the base."""
    for line in log.splitlines():
        found = BackendLine.parse(line)
        if found and found.start.startswith(RESUMING_FROM):
            return CHECKPOINT.step_of(Path(found.start.removeprefix(RESUMING_FROM)).name) or 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.recovery", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("attempt", help="record an attempt of the step; exit 3 past train.max_recoveries")
    failed = sub.add_parser("failed", help="record a failed attempt; exit 0: start again")
    failed.add_argument("--exit", type=int, required=True, dest="exit_code")
    sub.add_parser("report", help="write the recovery figures (logs/recovery.json)")
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["HPL_RUN_DIR"])
    step = os.environ.get("HPL_CHAIN_STEP", "train")
    job = os.environ.get("SLURM_JOB_ID", "none")
    if args.command == "report":
        write_report(run_dir, step, job)
        return 0
    run = read_run_facts(os.environ["HPL_RUN_CONFIG"]).run
    limit = run.train.max_recoveries if run else 0
    if args.command == "attempt":
        return start_attempt(run_dir, step, job, os.environ.get("SLURM_JOB_NODELIST", ""), limit)
    return 0 if attempt_failed(run_dir, step, job, args.exit_code, limit) else 1


if __name__ == "__main__":
    sys.exit(main())
