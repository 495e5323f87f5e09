"""Submit the whole pipeline as chained Slurm jobs, or report where a submitted one stands.

    python3 -m llm_pipeline.submit --config configs/default.toml [--from train] [--dry-run] [--wait]
    python3 -m llm_pipeline.submit status --config configs/default.toml

One sbatch job per step (payloads/slurm/<step>.sbatch), each after the previous one succeeded
(--dependency=afterok, --kill-on-invalid-dep=yes: a failed step cancels the rest). Prints one line
`submitted <step> job <id>` per step and where the logs are (<run folder>/logs/<step>-<job>.log).
Runs on the controller's system python3 (3.10, stdlib only): it reads from the run config just
the run folder and the node count (llm_pipeline.jobs.run_facts); the steps validate the rest.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import deploy_facts, partitions, pipeline_status
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts, RunFactsError, read_run_facts

STEPS = ("prepare", "download", "data", "precompile", "train", "consolidate", "merge", "generate")
MULTI_NODE_STEPS = ("precompile", "train")  # the others run one process on one node
PAYLOADS_DIR = Path(__file__).resolve().parents[1]
SLURM_FALLBACK_BIN = Path("/opt/slurm/bin")  # HyperPod's Slurm, for shells without it on PATH


class SubmitError(RuntimeError):
    """Submission cannot go on; the message says what to do."""


def slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; a missing command reads as a failed one (exit 127)."""
    binary = shutil.which(argv[0]) or str(SLURM_FALLBACK_BIN / argv[0])
    try:
        return subprocess.run([binary, *argv[1:]], capture_output=True, text=True)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")


def job_environment(facts: RunFacts, env: dict[str, str] | None = None) -> dict[str, str]:
    """What every job needs beyond the submitting shell's environment (sbatch exports that too).

    The image and runtime are pinned for the whole chain: a deploy while it runs cannot switch a
    later step to an image the prepare step never imported."""
    values = {
        "HPL_PAYLOADS_DIR": str(PAYLOADS_DIR),
        "HPL_RUN_CONFIG": str(facts.config),
        "HPL_RUN_DIR": str(facts.output_dir),
    }
    pinned = env or {}
    for name in (*deploy_facts.ENV_NAMES, *partitions.ENV_NAMES):
        if pinned.get(name):
            values[name] = pinned[name]
    for name, value in values.items():
        if "," in value:  # --export separates variables with commas
            raise SubmitError(f"{name}={value} contains a comma: move it to a path without one")
    return values


def check_runtime_sees(facts: RunFacts, env: dict[str, str]) -> None:
    """With Pyxis the steps see only FSx: the config and the run folder must live there."""
    if env.get("HPL_RUNTIME") != "pyxis":
        return
    fsx = Path(env.get("HPL_FSX_MOUNT_PATH") or "/fsx")
    for what, path in (("run config", facts.config), ("run folder (paths.output_dir)", facts.output_dir)):
        if fsx not in path.parents:
            raise SubmitError(
                f"{what} {path} is outside {fsx}, which is all the training image sees: put it under {fsx}"
            )


@dataclass(frozen=True)
class ChainJob:
    """One sbatch job of a chain (the pipeline's steps, or the torchtitan ladder's jobs)."""

    step: str  # the name in the record, the state marker and the log file
    script: str  # payloads/slurm/<script>
    args: tuple[str, ...] = ()
    multi_node: bool = False  # on [parallel] nodes nodes; else one node


def steps_from(first: str) -> tuple[str, ...]:
    return STEPS[STEPS.index(first) :]


def step_job(step: str) -> ChainJob:
    """The job of one step: payloads/slurm/<step>.sbatch, on every node for precompile and train."""
    return ChainJob(step, f"{step}.sbatch", multi_node=step in MULTI_NODE_STEPS)


def pipeline_jobs(first: str) -> list[ChainJob]:
    return [step_job(step) for step in steps_from(first)]


def sbatch_command(job: ChainJob, facts: RunFacts, after: str | None, env: dict[str, str]) -> list[str]:
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


def dry_run(facts: RunFacts, jobs: list[ChainJob], env: dict[str, str], *, what: str = "submission") -> None:
    """The submission as a shell script: each job id captured and fed to the next dependency."""
    print(f"# dry run: nothing submitted. The same {what} as a script:")
    print(f"mkdir -p {shlex.quote(str(facts.logs_dir))}/state")
    previous = None
    for job in jobs:
        variable = job.step.replace("-", "_") + "_job"
        words = [
            f'--dependency=afterok:"${previous}"' if word.startswith("--dependency=") else shlex.quote(word)
            for word in sbatch_command(job, facts, previous, env)
        ]
        print(f"{variable}=$({' '.join(words)})")
        previous = variable


def refuse_while_active(facts: RunFacts) -> None:
    """One submission per run folder at a time: its jobs share the step markers and the record."""
    active = [s for s in pipeline_status.step_states(facts.logs_dir, slurm) if s.active]
    if active:
        jobs = " ".join(s.job for s in active)
        raise SubmitError(
            f"the last submission for {facts.output_dir} is still going (jobs {jobs}): "
            f"wait for it (status), or cancel it with `scancel {jobs}`, then submit again"
        )


def submit_chain(
    facts: RunFacts, jobs: list[ChainJob], env: dict[str, str], *, kept: list[StepJob] | None = None
) -> list[StepJob]:
    """Submit ``jobs``, each after the previous; on a refused one, cancel what this call submitted.

    The record (logs/pipeline.json) lists ``kept`` (earlier jobs still valid) and the new ones."""
    (facts.logs_dir / "state").mkdir(parents=True, exist_ok=True)
    submitted: list[StepJob] = []
    for job in jobs:
        after = submitted[-1].job if submitted else None
        out = slurm(sbatch_command(job, facts, after, env))
        if out.returncode != 0:
            if submitted:
                slurm(["scancel", *(s.job for s in submitted)])
            raise SubmitError(
                f"sbatch refused job {job.step}: {out.stderr.strip() or out.stdout.strip()}"
                + (" (cancelled the jobs submitted before it)" if submitted else "")
            )
        job_id = out.stdout.strip().split(";")[0]
        submitted.append(StepJob(job.step, job_id, str(facts.logs_dir / f"{job.step}-{job_id}.log")))
        print(f"submitted {job.step} job {job_id}", flush=True)
    pipeline_status.write_record(facts.logs_dir, facts.config, [*(kept or []), *submitted])
    return submitted


def submit(facts: RunFacts, first: str, env: dict[str, str]) -> list[StepJob]:
    """Submit the pipeline from step `first`; the record keeps the earlier steps' jobs."""
    refuse_while_active(facts)
    kept = [
        job
        for job in pipeline_status.read_record(facts.logs_dir)
        if job.step in STEPS and STEPS.index(job.step) < STEPS.index(first)  # (a ladder's steps are not)
    ]
    return submit_chain(facts, pipeline_jobs(first), env, kept=kept)


def partition_environment(facts: RunFacts, env: dict[str, str], *, ladder: bool = False) -> dict[str, str]:
    """The run's partition and its facts (HPL_PARTITION, HPL_ACCELERATOR, HPL_DEVICES_PER_NODE, ...)."""
    known, default = deploy_facts.read_partitions(PAYLOADS_DIR)
    if not known:  # a local Slurm: no deploy facts; the run config may still name a partition
        return {"HPL_PARTITION": facts.partition} if facts.partition else {}
    accelerator = partitions.CUDA if ladder else partitions.ACCELERATOR_OF_BACKEND.get(facts.backend, "")
    name = partitions.choose_partition(
        known,
        requested=facts.partition,
        accelerator=accelerator,
        required=ladder or accelerator in partitions.REQUIRED,
        fallback=env.get("HPL_PARTITION", ""),
        default=default,
    )
    partitions.check_devices_per_node(name, known[name], None if ladder else facts.devices_per_node)
    return partitions.partition_environment(name, known[name])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "action",
        nargs="?",
        choices=("submit", "status", "ladder"),
        default="submit",
        help="submit the pipeline (default), report the state of the last submission, or submit the "
        "torchtitan pretraining ladder (docs/pretraining.md)",
    )
    parser.add_argument("--config", required=True, help="run config (TOML), e.g. configs/default.toml")
    parser.add_argument(
        "--from",
        dest="first",
        choices=STEPS,
        default=STEPS[0],
        help="start at this step; earlier steps' outputs must exist (default: %(default)s)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    parser.add_argument(
        "--wait", action="store_true", help="after submitting, follow the steps until the pipeline ends"
    )
    parser.add_argument(
        "--poll", type=float, default=10.0, help="seconds between checks with --wait (default: %(default)s)"
    )
    return parser.parse_args(argv)


def report(facts: RunFacts, states: list[pipeline_status.StepState]) -> int:
    for line in pipeline_status.describe(states):
        print(line)
    return 1 if pipeline_status.verdict(states)[0] == "FAILED" else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = dict(os.environ)
        facts = read_run_facts(args.config, env)
        env.update(partition_environment(facts, env, ladder=args.action == "ladder"))
        # The latest deploy's image and runtime (FSx payloads) win over the node profile's.
        env.update(deploy_facts.read_deploy_facts(PAYLOADS_DIR, partition=env.get("HPL_PARTITION")))
        check_runtime_sees(facts, env)
        if args.action == "status":
            if not pipeline_status.read_record(facts.logs_dir):
                raise SubmitError(f"no pipeline submitted for {facts.output_dir} (no {facts.logs_dir}/pipeline.json)")
            return report(facts, pipeline_status.step_states(facts.logs_dir, slurm))
        if args.action == "ladder":
            from llm_pipeline import ladder_submit  # imports this module: loaded only when asked for
        if args.dry_run:
            if args.action == "ladder":
                ladder_submit.dry_run(facts, env)
            else:
                dry_run(facts, pipeline_jobs(args.first), env)
            return 0
        if slurm(["sbatch", "--version"]).returncode != 0:
            raise SubmitError("sbatch not found: run this on the cluster's controller or login node")
        if args.action == "ladder":
            ladder_submit.submit(facts, env)
        else:
            submit(facts, args.first, env)
        print(f"logs: {facts.logs_dir}/<step>-<job>.log")
        print(f"status: python3 -m llm_pipeline.submit status --config {facts.config}")
        if args.wait:
            return report(facts, pipeline_status.wait(facts.logs_dir, slurm, poll_s=args.poll))
        return 0
    except (RunFactsError, SubmitError, StepError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
