"""Submit the torchtitan ladder as chained Slurm jobs (`python3 -m llm_pipeline.submit ladder`).

    prepare -> tokenizer -> rung-<r> for each of torchtitan.rungs -> report -> export

prepare is the pipeline's own first step (with Pyxis it imports the image of the partition the
ladder runs on into FSx; then the run config validates and the training stack imports there).

Each job after the previous one succeeded (afterok; a failed job cancels the rest). The rungs run
on `[parallel] nodes` nodes (payloads/slurm/ladder-rung.sbatch <rung>), the other jobs on one.
The record and the step markers are the pipeline's (<run>/logs/pipeline.json, logs/state/), so
`submit status` and `--wait` follow a ladder as they follow the pipeline.
Controller side: Python 3.10 stdlib only. The rung list is read with a one-line reader (no tomllib
there); the steps validate the whole run config.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.config import TORCHTITAN_RUNGS, TorchtitanConfig
from llm_pipeline.jobs import pipeline_status
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts, RunFactsError
from llm_pipeline.submit import PAYLOADS_DIR, SubmitError, job_environment, slurm

_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_RUNGS = re.compile(r"^\s*rungs\s*=\s*(\[[^\]]*\])\s*(#.*)?$")


@dataclass(frozen=True)
class LadderJob:
    step: str  # the name in the record and the state marker
    script: str  # payloads/slurm/<script>
    args: tuple[str, ...]
    multi_node: bool


def read_rungs(config: Path) -> tuple[str, ...]:
    """`[torchtitan] rungs`, written on one line as a list of double-quoted names (or the default)."""
    table = ""
    for number, line in enumerate(config.read_text().splitlines(), 1):
        header = _TABLE.match(line)
        if header:
            table = header.group(1)
            continue
        if table != "torchtitan" or not re.match(r"\s*rungs\s*=", line):
            continue
        match = _RUNGS.match(line)
        try:
            rungs = json.loads(match.group(1)) if match else None
        except json.JSONDecodeError:
            rungs = None
        if not isinstance(rungs, list) or not all(isinstance(r, str) for r in rungs):
            raise RunFactsError(
                f"{config}:{number} torchtitan.rungs: write it on one line as a list of quoted names, "
                f'e.g. ["baseline", "compile"]'
            )
        unknown = [r for r in rungs if r not in TORCHTITAN_RUNGS]
        if unknown or not rungs or len(set(rungs)) != len(rungs):
            raise RunFactsError(
                f"{config}:{number} torchtitan.rungs: {rungs!r} must name each of "
                f"{', '.join(TORCHTITAN_RUNGS)} at most once, at least one"
            )
        return tuple(rungs)
    return TorchtitanConfig().rungs


def ladder_jobs(rungs: tuple[str, ...]) -> list[LadderJob]:
    return [
        LadderJob("prepare", "prepare.sbatch", (), False),
        LadderJob("tokenizer", "ladder-tokenizer.sbatch", (), False),
        *(LadderJob(f"rung-{rung}", "ladder-rung.sbatch", (rung,), True) for rung in rungs),
        LadderJob("report", "ladder-report.sbatch", (), False),
        LadderJob("export", "ladder-export.sbatch", (), False),
    ]


def sbatch_command(job: LadderJob, facts: RunFacts, after: str | None, env: dict[str, str]) -> list[str]:
    exports = ",".join(["ALL", *(f"{key}={value}" for key, value in job_environment(facts, env).items())])
    command = [
        "sbatch",
        "--parsable",
        f"--job-name=hpl-{job.step}",
        f"--output={facts.logs_dir / job.step}-%j.log",
        f"--nodes={facts.nodes if job.multi_node else 1}",
        f"--export={exports}",
    ]
    if env.get("HPL_PARTITION"):
        command.append(f"--partition={env['HPL_PARTITION']}")
    if after:
        command += [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"]
    return [*command, str(PAYLOADS_DIR / "slurm" / job.script), *job.args]


def dry_run(facts: RunFacts, env: dict[str, str]) -> None:
    """The ladder submission as a shell script: each job id captured and fed to the next dependency."""
    print("# dry run: nothing submitted. The same ladder submission as a script:")
    print(f"mkdir -p {shlex.quote(str(facts.logs_dir))}/state")
    previous = None
    for job in ladder_jobs(read_rungs(facts.config)):
        variable = job.step.replace("-", "_") + "_job"
        words = [
            f'--dependency=afterok:"${previous}"' if word.startswith("--dependency=") else shlex.quote(word)
            for word in sbatch_command(job, facts, previous, env)
        ]
        print(f"{variable}=$({' '.join(words)})")
        previous = variable


def submit(facts: RunFacts, env: dict[str, str]) -> list[StepJob]:
    """Submit the whole ladder; on a refused submission, cancel what this call submitted."""
    active = [s for s in pipeline_status.step_states(facts.logs_dir, slurm) if s.active]
    if active:
        jobs = " ".join(s.job for s in active)
        raise SubmitError(
            f"the last submission for {facts.output_dir} is still going (jobs {jobs}): "
            f"wait for it (status), or cancel it with `scancel {jobs}`, then submit again"
        )
    rungs = read_rungs(facts.config)
    (facts.logs_dir / "state").mkdir(parents=True, exist_ok=True)
    submitted: list[StepJob] = []
    for job in ladder_jobs(rungs):
        after = submitted[-1].job if submitted else None
        out = slurm(sbatch_command(job, facts, after, env))
        if out.returncode != 0:
            if submitted:
                slurm(["scancel", *(s.job for s in submitted)])
            raise SubmitError(
                f"sbatch refused ladder job {job.step}: {out.stderr.strip() or out.stdout.strip()}"
                + (" (cancelled the jobs submitted before it)" if submitted else "")
            )
        job_id = out.stdout.strip().split(";")[0]
        submitted.append(StepJob(job.step, job_id, str(facts.logs_dir / f"{job.step}-{job_id}.log")))
        print(f"submitted {job.step} job {job_id}", flush=True)
    pipeline_status.write_record(facts.logs_dir, facts.config, submitted)
    return submitted
