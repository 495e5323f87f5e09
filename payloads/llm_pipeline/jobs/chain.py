"""Chains of sbatch jobs, each after the previous one succeeded: what submit, the ladder and the sweep share.

``--dependency=afterok`` with ``--kill-on-invalid-dep=yes``: a failed job cancels the rest. Every job
gets the run's environment (payloads dir, run config and folder, and the image, runtime and partition
facts pinned for the whole chain); a refused submission cancels the jobs this call submitted.
Stdlib only (the controller's python3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.config import FP8_RUNGS, RunConfig, rollout_split
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import accounts, capacity, deploy_facts, partitions, pipeline_status, run_lock, smoke
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import SLURM_JOB_ID, STATE_DIR, StepLog, SubmittedLine

PAYLOADS_DIR = Path(__file__).resolve().parents[2]
SLURM_FALLBACK_BIN = Path("/opt/slurm/bin")  # HyperPod's Slurm, for shells without it on PATH

# The first line of every dry run's output, and the line that ends its table and opens the script (hpctl opens
# its own dry run with what lies between them).
DRY_RUN_OPENING = "# dry run: nothing submitted."
DRY_RUN_SCRIPT_OPENING = "# the same "
AFTER_VARIABLE = "after_job"  # the dry run's shell variable for a job outside the chain that its first job waits for


class SubmitError(PipelineError, RuntimeError):
    """Submission cannot go on; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class ChainJob:
    """One sbatch job of a chain (the pipeline's steps, the torchtitan ladder's jobs, a sweep's points)."""

    step: str  # the name in the record, the state marker and the log file
    script: str  # payloads/slurm/<script>
    args: tuple[str, ...] = ()
    multi_node: bool = False  # on [parallel] nodes nodes; else one node
    # Its output (image, model, tokenized data, tokenizer) serves the smoke run and the long run
    # alike: it runs once, before the smoke stage (jobs/smoke.py), and gets no smoke copy.
    shared: bool = False
    # It trains: a chain with such a job gets a smoke stage, and the estimate scales its smoke step time.
    trains: bool = False
    # It resumes from its newest checkpoint when started again: its smoke copy runs twice, saving, then resuming.
    resumes: bool = False
    compiles: bool = False  # it fills the Neuron compile cache (a training job's leader writes it back after it)
    leader_only: bool = False  # in a training job of several hosts: on the first host only
    job_only: bool = False  # a training job's step only (no Slurm script): gather
    outputs: tuple[str, ...] = ()  # what it writes into the run folder, made from one checkpoint
    # Its module's arguments in a training job (sagemaker_job), after --config: the job owns its run folder, so a
    # restarted job rewrites what an earlier attempt left half done (--overwrite).
    job_args: tuple[str, ...] = ()
    # A step only some runs ask for: in their chain when this says so of the run config (None: every run's).
    wanted: Callable[[RunConfig], bool] | None = None

    def wanted_by(self, run: RunConfig | None) -> bool:
        return self.wanted is None or run is None or self.wanted(run)


# Between the smoke stage and the long jobs.
ESTIMATE_JOB = ChainJob(step=smoke.ESTIMATE_STEP, script=f"{smoke.ESTIMATE_STEP}.sbatch")


def slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; a missing command reads as a failed one (exit 127)."""
    binary = shutil.which(argv[0]) or str(SLURM_FALLBACK_BIN / argv[0])
    try:
        return subprocess.run([binary, *argv[1:]], capture_output=True, text=True)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")


def require_sbatch() -> None:
    if slurm(["sbatch", "--version"]).returncode != 0:
        raise SubmitError("sbatch not found: run this on the cluster's controller or login node")


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
    for name in (*deploy_facts.ENV_NAMES, *partitions.ENV_NAMES, *capacity.SCALE_ENV.values()):
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


def partition_environment(
    facts: RunFacts, env: dict[str, str], *, ladder: bool = False, rungs: tuple[str, ...] = ()
) -> dict[str, str]:
    """The run's partition and its facts (HPL_PARTITION, HPL_ACCELERATOR, HPL_DEVICES_PER_NODE, ...).
    For the ladder, ``rungs`` decide whether the partition needs FP8 GPUs."""
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
        fp8=any(rung in FP8_RUNGS for rung in rungs),
    )
    if ladder:
        partitions.check_fp8_rungs(name, known[name], rungs)
    partitions.check_devices_per_node(name, known[name], None if ladder else facts.devices_per_node)
    return partitions.partition_environment(name, known[name])


def job_nodes(job: ChainJob, facts: RunFacts) -> int:
    return facts.nodes if job.multi_node else 1


def smoke_stage_runs(jobs: list[ChainJob], requested: bool) -> bool:
    """A smoke stage guards training: a chain without a training job (``--from consolidate``) has no
    smoke checkpoint to work on, and nothing long to protect."""
    return requested and any(job.trains for job in jobs)


def with_smoke_stage(
    planned: list[tuple[ChainJob, RunFacts]],
    smoke_runs: Callable[[RunFacts], tuple[RunFacts, RunFacts]],
    estimate_facts: RunFacts,
) -> list[tuple[ChainJob, RunFacts]]:
    """``planned`` (job, the run it belongs to) with its smoke stage: the shared jobs, a smoke copy of every
    other job on the smoke run ``smoke_runs`` names for its run (a resuming job twice: on the saving run,
    then resumed on the whole one), the estimate (on ``estimate_facts``), then the long jobs (jobs/smoke.py)."""
    copies: list[tuple[ChainJob, RunFacts]] = []
    long = [(job, facts) for job, facts in planned if not job.shared]
    for job, facts in (item for item in long if smoke.copied(item[0].step)):
        save, whole = smoke_runs(facts)
        copy = dataclasses.replace(job, step=smoke.PREFIX + job.step)
        if job.resumes:
            copies += [(copy, save), (dataclasses.replace(copy, step=copy.step + smoke.RESUME_SUFFIX), whole)]
        else:
            copies.append((copy, whole))
    shared = [(job, facts) for job, facts in planned if job.shared]
    return [*shared, *copies, (ESTIMATE_JOB, estimate_facts), *long]


def staged_chain(facts: RunFacts, jobs: list[ChainJob], *, smoke_stage: bool) -> list[tuple[ChainJob, RunFacts]]:
    """(job, the run it belongs to) in submission order: with the smoke stage, the smoke copies run on
    <run>/smoke. The smoke run's configs are named here; write_smoke_run writes them."""
    if not smoke_stage_runs(jobs, smoke_stage):
        return [(job, facts) for job in jobs]
    folder = smoke.smoke_dir(facts)
    save, full = (dataclasses.replace(facts, config=folder / name, output_dir=folder) for name in smoke.CONFIGS)
    return with_smoke_stage([(job, facts) for job in jobs], lambda _: (save, full), facts)


def sbatch_command(job: ChainJob, facts: RunFacts, after: str | None, env: dict[str, str]) -> list[str]:
    exports = ",".join(["ALL", *(f"{key}={value}" for key, value in job_environment(facts, env).items())])
    command = [
        "sbatch",
        "--parsable",
        f"--job-name=hpl-{job.step}",
        f"--output={facts.logs_dir / StepLog(job.step, SLURM_JOB_ID).name}",
        f"--nodes={job_nodes(job, facts)}",
        f"--export={exports},HPL_CHAIN_STEP={job.step}",
    ]
    if env.get("HPL_PARTITION"):
        command.append(f"--partition={env['HPL_PARTITION']}")
    command += accounts.sbatch_options(env)  # the team's account and QOS (jobs/accounts.py)
    if after:
        command += [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"]
    return [*command, str(PAYLOADS_DIR / "slurm" / job.script), *job.args]


def plan_table(planned: list[tuple[ChainJob, RunFacts]], env: dict[str, str], *, after: str | None = None) -> list[str]:
    """Where each job of a chain runs, as a table: step, partition, nodes x devices, the job it waits for
    (``after``: a job outside the chain the first one waits for)."""
    partition = env.get("HPL_PARTITION") or "(cluster default)"
    accelerator = env.get("HPL_ACCELERATOR", "")
    rows = [("step", "partition", "nodes x devices", "depends on")]
    previous = f"job {after}" if after else "-"
    for job, facts in planned:
        devices = env.get("HPL_DEVICES_PER_NODE") or (str(facts.devices_per_node) if facts.devices_per_node else "?")
        kind = f" {accelerator}" if accelerator and accelerator != partitions.NO_ACCELERATOR else ""
        rows.append((job.step, partition, f"{job_nodes(job, facts)} x {devices}{kind}", previous))
        previous = job.step
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["# " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def dry_run(
    facts: RunFacts,
    jobs: list[ChainJob],
    env: dict[str, str],
    *,
    what: str = "submission",
    smoke_stage: bool = True,
    after: str | None = None,
) -> None:
    """The chain as a table (plan_table), then the submission as a shell script: each job id captured and fed
    to the next dependency (the first's: ``after``, a job outside the chain, when given)."""
    print(f"{DRY_RUN_OPENING} The {what}, job by job (each starts after the one it depends on):")
    for line in plan_table(staged_chain(facts, jobs, smoke_stage=smoke_stage), env, after=after):
        print(line)
    split = facts.run and rollout_split(facts.run)
    if split and any(job.step == "train" for job in jobs):
        print(f"# train: {split}")
    print(f"{DRY_RUN_SCRIPT_OPENING}{what} as a script:")
    print(f"mkdir -p {shlex.quote(str(facts.logs_dir))}/state")
    if smoke_stage_runs(jobs, smoke_stage):
        print(f"# first: {smoke.smoke_dir(facts)}/ with {' and '.join(smoke.CONFIGS)} (the smoke run's configs)")
    previous = None
    if after:
        print(f"{AFTER_VARIABLE}={shlex.quote(after)}")
        previous = AFTER_VARIABLE
    for job, job_facts in staged_chain(facts, jobs, smoke_stage=smoke_stage):
        variable = job.step.replace("-", "_") + "_job"
        words = [
            f'--dependency=afterok:"${previous}"' if word.startswith("--dependency=") else shlex.quote(word)
            for word in sbatch_command(job, job_facts, previous, env)
        ]
        print(f"{variable}=$({' '.join(words)})")
        previous = variable


@contextlib.contextmanager
def one_chain(facts: RunFacts, *, wait_s: float = run_lock.WAIT_S) -> Iterator[None]:
    """One chain per run folder (its jobs share the step markers and the record): under the run's lock
    (jobs/run_lock), refuse while a chain recorded for it is pending or running, then let the caller submit
    and record its chain before the lock goes. Without the lock, two submissions a moment apart would both
    find no live chain and both submit."""
    with run_lock.RunLock(facts.logs_dir, wait_s=wait_s):
        try:
            states = pipeline_status.step_states(facts.logs_dir, slurm)
        except pipeline_status.SlurmUnreachable as exc:
            raise SubmitError(
                f"cannot tell whether the last submission for {facts.output_dir} still runs ({exc}): "
                "submit again once `squeue` answers"
            ) from None
        active = [s.job for s in states if s.active]
        if active:
            jobs = " ".join(active)
            raise SubmitError(
                f"the last submission for {facts.output_dir} is still going (jobs {jobs}): "
                f"wait for it (status), or cancel it with `scancel {jobs}`, then submit again"
            )
        yield


def submit_jobs(
    planned: list[tuple[ChainJob, RunFacts]],
    env: dict[str, str],
    *,
    label: Callable[[ChainJob, RunFacts], str] = lambda job, facts: job.step,
    after: str | None = None,
) -> list[StepJob]:
    """Submit each (job, the run it belongs to) after the previous (the first after ``after``, a job outside the
    chain, when given); on a refused one, cancel what this call submitted and raise. Prints `submitted <label>
    job <id>` per job."""
    submitted: list[StepJob] = []
    for job, facts in planned:
        after = submitted[-1].job if submitted else after
        out = slurm(sbatch_command(job, facts, after, env))
        if out.returncode != 0:
            if submitted:
                slurm(["scancel", *(s.job for s in submitted)])
            raise SubmitError(
                f"sbatch refused job {label(job, facts)}: {out.stderr.strip() or out.stdout.strip()}"
                + (" (cancelled the jobs submitted before it)" if submitted else "")
            )
        job_id = out.stdout.strip().split(";")[0]
        log = str(facts.logs_dir / StepLog(job.step, job_id).name)
        submitted.append(
            StepJob(step=job.step, job=job_id, log=log, nodes=job_nodes(job, facts), config=str(facts.config))
        )
        print(SubmittedLine(label(job, facts), job_id).format(), flush=True)
    return submitted


def submit_chain(
    facts: RunFacts,
    jobs: list[ChainJob],
    env: dict[str, str],
    *,
    kept: list[StepJob] | None = None,
    smoke_stage: bool = True,
    after: str | None = None,
) -> list[StepJob]:
    """Submit one run's ``jobs`` as a chain (its first job after ``after`` when given), after a smoke stage unless
    ``smoke_stage`` is off; the record (logs/pipeline.json) lists ``kept`` (earlier jobs still valid) and the new
    ones."""
    (facts.logs_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
    if smoke_stage_runs(jobs, smoke_stage):
        smoke.write_smoke_run(facts)
        print(
            f"smoke stage: each step on {smoke.smoke_dir(facts)} first, {smoke.SMOKE_STEPS} training steps "
            f"(saved at {smoke.SAVE_STEP}, resumed); the long steps start only if it passes",
            flush=True,
        )
    elif not smoke_stage:
        print(f"note: {smoke.NO_SMOKE_RISK}", flush=True)
    submitted = submit_jobs(staged_chain(facts, jobs, smoke_stage=smoke_stage), env, after=after)
    pipeline_status.write_record(facts.logs_dir, facts.config, [*(kept or []), *submitted])
    return submitted


INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def run_submitter(body: Callable[[], int]) -> int:
    """Run a submit command's body: a refused input is one `error:` line and exit 2; Ctrl-C one line, no traceback
    (what was submitted keeps running: Ctrl-C stops only the following)."""
    try:
        return body()
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: jobs already submitted keep running (see them with status)", file=sys.stderr)
        return INTERRUPTED_EXIT
