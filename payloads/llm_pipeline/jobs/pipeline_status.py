"""Where a submitted pipeline stands: each step's state and the step that failed.

Sources, best first: Slurm (squeue knows jobs until MinJobAge after they end; sacct where the
cluster keeps accounting), then the marker each step script writes to <run>/logs/state/<step>.json
when it starts and ends (a smoke job's: <run>/smoke/logs/state/smoke-<step>.json, beside its log).
A job Slurm has forgotten that never wrote a marker never ran (it was cancelled because an earlier
step failed, or by hand). A failed squeue (or sacct, other than "no accounting") says nothing about
the jobs: it raises SlurmUnreachable, which `wait` reports and retries, instead of reading every job
as gone.

Stdlib only: runs on the controller's system python3 (3.10).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import PipelineError
from llm_pipeline.run_files import PIPELINE_FILE, STATE_DIR, PipelineRecord, StepJob, StepMarker

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "STAGE_OUT"}
NEVER_RAN = "NOT_RUN"
NO_RECORD = "NO_RECORD"  # the verdict of a run folder whose record lists no job
# What sacct says on a cluster that keeps no accounting (the local rehearsal): the markers answer instead.
NO_ACCOUNTING = ("accounting storage is disabled", "accounting_storage/none")
UNREACHABLE_RETRIES = 3  # a one-shot status asks this often before it gives up


class SlurmUnreachable(PipelineError, RuntimeError):
    """squeue or sacct failed: Slurm's view of the jobs is unknown, which is not a verdict on them."""

    def __init__(self, command: str, result: subprocess.CompletedProcess) -> None:
        said = " ".join((result.stderr or result.stdout or "").split()) or f"{command} exited {result.returncode}"
        super().__init__(f"cannot reach Slurm: {said}")


@dataclass(frozen=True)
class StepState:
    step: str
    job: str
    state: str  # a Slurm job state, or NOT_RUN / LOST
    detail: str  # Slurm's reason or where the state came from
    log: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


# -- the record submit writes --------------------------------------------------------------------
def record_path(logs_dir: Path) -> Path:
    return logs_dir / PIPELINE_FILE


def write_record(logs_dir: Path, config: Path, jobs: list[StepJob]) -> None:
    tmp = record_path(logs_dir).with_suffix(".json.tmp")
    tmp.write_text(PipelineRecord(str(config), tuple(jobs)).to_json())
    tmp.replace(record_path(logs_dir))


def read_record(logs_dir: Path) -> list[StepJob]:
    path = record_path(logs_dir)
    if not path.is_file():
        return []
    return list(PipelineRecord.from_json(path.read_text()).steps)


# -- Slurm's view --------------------------------------------------------------------------------
def slurm_states(
    job_ids: list[str], run: Callable[[list[str]], subprocess.CompletedProcess]
) -> dict[str, tuple[str, str]]:
    """{job id: (state, reason)} for the jobs Slurm still knows."""
    known: dict[str, tuple[str, str]] = {}
    if not job_ids:
        return known
    out = run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%r"])
    if out.returncode != 0:
        raise SlurmUnreachable("squeue", out)
    for line in out.stdout.splitlines():
        job, state, reason = [*line.split("|"), "", ""][:3]
        if job in job_ids:
            known[job] = (state, "" if reason == "None" else reason)
    missing = [job for job in job_ids if job not in known]
    if missing:  # accounting, where the cluster keeps it (HyperPod can; the local rehearsal does not)
        out = run(["sacct", "-n", "-P", "-X", "-j", ",".join(missing), "-o", "JobID,State"])
        if out.returncode != 0 and not no_accounting(out):
            raise SlurmUnreachable("sacct", out)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                job, _, state = line.partition("|")
                if job in missing and state:
                    known[job] = (state.split()[0], "from sacct")
    return known


def no_accounting(result: subprocess.CompletedProcess) -> bool:
    """sacct failed because the cluster keeps no accounting (or said nothing), not because Slurm is away."""
    said = (result.stderr or "").strip()
    return not said or any(text in said for text in NO_ACCOUNTING)


def _marker(state_dir: Path, job: StepJob) -> StepMarker | None:
    """The step's marker when this job wrote it (a resubmission's job id differs), else None."""
    try:
        marker = StepMarker.from_json((state_dir / f"{job.step}.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return marker if marker.job == job.job else None


def step_states(logs_dir: Path, run: Callable[[list[str]], subprocess.CompletedProcess]) -> list[StepState]:
    jobs = read_record(logs_dir)
    known = slurm_states([job.job for job in jobs], run)
    states = []
    for job in jobs:
        marker = _marker(Path(job.log).parent / STATE_DIR, job)  # a smoke job's lies in the smoke run
        if job.job in known:
            state, detail = known[job.job]
        elif marker and marker.final:
            state, detail = marker.state, f"exit {marker.exit_code} (step marker)"
        elif marker:
            state, detail = (
                "LOST",
                f"marked {marker.state} on {marker.node} but gone from Slurm (node failure?)",
            )
        else:
            state, detail = NEVER_RAN, "gone from Slurm without starting (cancelled)"
        states.append(StepState(job.step, job.job, state, detail, job.log))
    return states


def verdict(states: list[StepState]) -> tuple[str, StepState | None]:
    """("COMPLETED" | "RUNNING" | "FAILED" | NO_RECORD, the failed or current step): no job is no success."""
    if not states:
        return NO_RECORD, None
    for state in states:
        if not state.ok and not state.active:
            return "FAILED", state
    for state in states:
        if state.active:
            return "RUNNING", state
    return "COMPLETED", None


def step_width(states: list[StepState]) -> int:
    """The step column's width: the longest name (smoke-train-resume, smoke-rung-fp8_allgather) fits."""
    return max([12, *(len(s.step) for s in states)])


def describe(states: list[StepState]) -> list[str]:
    width = step_width(states)
    lines = [f"{'step':<{width}} {'job':>8}  {'state':<10} detail"]
    lines += [f"{s.step:<{width}} {s.job:>8}  {s.state:<10} {s.detail}" for s in states]
    overall, step = verdict(states)
    if overall == "FAILED":
        lines.append(f"pipeline: FAILED at step {step.step} (job {step.job}, {step.state}): see {step.log}")
    elif overall == "RUNNING":
        lines.append(f"pipeline: RUNNING, at step {step.step} (job {step.job}, {step.state})")
    elif overall == NO_RECORD:
        lines.append(f"pipeline: no job recorded (no {PIPELINE_FILE} or an empty one): nothing ran")
    else:
        lines.append("pipeline: COMPLETED")
    return lines


def states_retrying(
    logs_dir: Path,
    run: Callable[[list[str]], subprocess.CompletedProcess],
    *,
    retries: int = UNREACHABLE_RETRIES,
    pause_s: float = 2.0,
    echo: Callable[[str], None] = print,
) -> list[StepState]:
    """step_states, asking Slurm up to ``retries`` times while it cannot be reached (each miss echoed);
    SlurmUnreachable when it never answered."""
    for attempt in range(1, retries):
        try:
            return step_states(logs_dir, run)
        except SlurmUnreachable as exc:
            echo(f"{exc} (try {attempt}/{retries}; asking again in {pause_s:g} s)")
            time.sleep(pause_s)
    return step_states(logs_dir, run)


def wait(
    logs_dir: Path,
    run: Callable[[list[str]], subprocess.CompletedProcess],
    *,
    poll_s: float = 5.0,
    echo: Callable[[str], None] = print,
) -> list[StepState]:
    """Poll until no step is pending or running; print each state change as it happens (a step starts out
    PENDING, so the queue's first look prints one line, not one per step). A poll that cannot reach Slurm is
    reported (once per message) and retried: it changes no state."""
    seen: dict[str, str] = {}
    unreachable = ""
    start = time.monotonic()
    first = True
    while True:
        try:
            states = step_states(logs_dir, run)
        except SlurmUnreachable as exc:
            if str(exc) != unreachable:
                unreachable = str(exc)
                echo(f"[{time.monotonic() - start:6.0f}s] {exc} (asking again every {poll_s:g} s)")
            time.sleep(poll_s)
            continue
        if unreachable:
            unreachable = ""
            echo(f"[{time.monotonic() - start:6.0f}s] Slurm answers again")
        width = step_width(states)
        if first:
            first = False
            pending = [s.step for s in states if s.state == "PENDING"]
            seen.update(dict.fromkeys(pending, "PENDING"))
            if pending:
                echo(f"[{time.monotonic() - start:6.0f}s] {len(pending)} of {len(states)} jobs PENDING")
        for s in states:
            if seen.get(s.step) != s.state:
                seen[s.step] = s.state
                echo(f"[{time.monotonic() - start:6.0f}s] {s.step:<{width}} {s.state:<10} job {s.job}  {s.detail}")
        if not any(s.active for s in states):
            return states
        time.sleep(poll_s)
