"""Submit the whole pipeline as chained Slurm jobs, or report where a submitted one stands.

    python3 -m llm_pipeline.submit --config configs/default.toml [--from train] [--to merge] [--dry-run] [--wait]
    python3 -m llm_pipeline.submit status --config configs/default.toml

One sbatch job per step (payloads/slurm/<step>.sbatch), each after the previous one succeeded
(--dependency=afterok, --kill-on-invalid-dep=yes: a failed step cancels the rest); with train.init_from, the first
waits for the named run's merge job while that run's chain is queued or running (init_run_wait). Prints one line
`submitted <step> job <id>` per step and where the logs are (<run folder>/logs/<step>-<job>.log).
Runs on the controller's system python3 (3.10, stdlib only): it loads and validates the whole run config
(config.load, llm_pipeline.jobs.run_facts) as the steps do.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

from llm_pipeline import __version__, ladder_submit, run_state
from llm_pipeline.config import PathsConfig, RunConfig
from llm_pipeline.jobs import accounts, capacity_chain, deploy_facts, estimate, pipeline_status, serving_image, smoke
from llm_pipeline.jobs.chain import (
    PAYLOADS_DIR,
    ChainJob,
    SubmitError,
    check_runtime_sees,
    dry_run,
    one_chain,
    partition_environment,
    require_sbatch,
    run_submitter,
    slurm,
    submit_chain,
)
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts, read_run_facts
from llm_pipeline.run_files import CHECKPOINT, StepLog
from llm_pipeline.weights import model_files

# The pipeline: every step in order, each one record (payloads/slurm/<step>.sbatch; a training job runs the same
# steps, gather too: sagemaker_job). Shared steps run once, their image, model and data serve the smoke run too;
# precompile and train run on every node; train resumes from its newest checkpoint (smoke-tested saving, then
# resuming); what the steps after train write (config.py's PathsConfig layout) is stale once a chain trains on.
PIPELINE = (
    ChainJob(step="prepare", script="prepare.sbatch", shared=True),
    ChainJob(step="download", script="download.sbatch", shared=True),
    ChainJob(step="data", script="data.sbatch", shared=True),
    ChainJob(step="precompile", script="precompile.sbatch", multi_node=True, compiles=True),
    ChainJob(step="train", script="train.sbatch", multi_node=True, trains=True, resumes=True, compiles=True),
    ChainJob(
        step="gather", script="", job_only=True
    ),  # a training job of several hosts: the checkpoint onto the leader
    ChainJob(
        step="consolidate",
        script="consolidate.sbatch",
        leader_only=True,
        outputs=("adapter", "merged"),
        job_args=("--overwrite",),
    ),
    ChainJob(step="merge", script="merge.sbatch", leader_only=True, outputs=("merged",), job_args=("--overwrite",)),
    ChainJob(step="generate", script="generate.sbatch", leader_only=True, outputs=("generation.txt",)),
    ChainJob(step="evaluate", script="evaluate.sbatch", leader_only=True, outputs=("eval",)),
    ChainJob(
        step="benchmark",
        script="benchmark.sbatch",
        leader_only=True,
        outputs=("benchmark",),
        wanted=lambda run: run.benchmark.runs(),
    ),
)
PIPELINE_STEPS = {job.step: job for job in PIPELINE}
STEPS = tuple(job.step for job in PIPELINE if not job.job_only)  # a Slurm chain's
JOB_STEPS = tuple(job.step for job in PIPELINE)  # a training job's (llm_pipeline.sagemaker_job): gather too
SHARED_STEPS = tuple(job.step for job in PIPELINE if job.shared)
TRAINING_STEPS = tuple(job.step for job in PIPELINE if job.trains)
SHIPPING_STEPS = ("consolidate", "merge")  # they ship the finished checkpoint (run_state.shipped_checkpoint)
TRAINED_OUTPUTS = tuple(dict.fromkeys(name for job in PIPELINE for name in job.outputs))
REPLACED_FOLDER = "replaced"  # <run>/replaced/<UTC time>/: earlier outputs moved aside by --replace-outputs
REPLACE_FLAG = run_state.REPLACE_FLAG


def step_job(step: str) -> ChainJob:
    """The record of one step (PIPELINE)."""
    return PIPELINE_STEPS[step]


def chain_steps(first: str, last: str | None = None, steps: tuple[str, ...] = STEPS) -> tuple[str, ...]:
    """``steps`` (a Slurm chain's, or a training job's) from ``first`` through ``last`` (None: to the end), in the
    pipeline's order: --from and --to of submit and of sagemaker_job."""
    if last is not None and steps.index(last) < steps.index(first):
        raise SubmitError(f"--to {last}: comes before --from {first}; give a step from {first} on")
    return steps[steps.index(first) : steps.index(last or steps[-1]) + 1]


def pipeline_jobs(first: str, run: RunConfig | None = None, last: str | None = None) -> list[ChainJob]:
    """The chain's jobs from ``first`` through ``last``: the steps ``run`` asks for (ChainJob.wanted)."""
    steps = chain_steps(first, last)
    jobs = [job for job in map(step_job, steps) if job.wanted_by(run)]
    if not jobs:
        raise SubmitError(f"--from {first}: the run config asks for none of {', '.join(steps)}")
    return jobs


def earlier_outputs(facts: RunFacts, first: str) -> list[Path]:
    """The outputs of an earlier training that a chain from ``first`` would leave beside a newer checkpoint:
    the steps after train's, when the chain trains (none when it starts after train)."""
    if not set(TRAINING_STEPS) & set(chain_steps(first)):
        return []
    return [facts.output_dir / name for name in TRAINED_OUTPUTS if (facts.output_dir / name).exists()]


def check_earlier_outputs(facts: RunFacts, first: str, *, replace: bool) -> list[Path]:
    """Refuse a chain that trains into a run folder holding outputs of an earlier training (consolidate
    would refuse its adapter/ hours later, and the folder would mix two checkpoints), or a finished run's
    checkpoints when the config changes what it learned (run_state: train would refuse them after the smoke
    stage), unless ``replace``; the outputs to move aside."""
    changed, checkpoints = [], facts.run.paths.checkpoints_dir if facts.run else None
    if checkpoints is not None and set(TRAINING_STEPS) & set(chain_steps(first)):
        record = run_state.read_finished(checkpoints)
        changed = run_state.replaced_by(record, facts.run.learned())
        if changed and not replace:
            raise SubmitError(run_state.refusal(record, changed, checkpoints))
    elif checkpoints is not None and set(SHIPPING_STEPS) & set(chain_steps(first)):
        # a chain after train ships the finished checkpoint: never one another config trained (a raised
        # train.max_steps among them: that trains first); the steps refuse it too (run_state.shipped_checkpoint)
        record = run_state.read_finished(checkpoints)
        shipped = run_state.changed_keys(record, facts.run.learned()) if record else []
        if shipped:
            raise SubmitError(
                f"submit --from {first} would ship {CHECKPOINT.name(record.step)}, which finished with "
                f"other values: {'; '.join(shipped)}: submit from train to train on to a raised train.max_steps "
                f"(an extension), or set the keys back to ship it as it is"
            )
    found = earlier_outputs(facts, first)
    if found and not replace:
        raise SubmitError(
            f"{facts.output_dir} holds outputs of an earlier training ({', '.join(p.name for p in found)}), which "
            f"the steps after train would not replace: add {REPLACE_FLAG} to move them aside into "
            f"{facts.output_dir / REPLACED_FOLDER}/<time>/ before the chain starts"
        )
    return [checkpoints, *found] if changed else found


INIT_STEP = "merge"  # the step whose output train.init_from starts from (config.py: the named run's merged/)


def init_run_wait(facts: RunFacts) -> str | None:
    """train.init_from's run: the job id of its merge job while that is queued or running (this chain waits for it),
    None when its merged model is there; refused when the run is not there, or has neither."""
    cfg = facts.run
    if cfg is None or not cfg.train.init_from:
        return None
    folder, model = Path(cfg.train.init_from), Path(cfg.paths.model_dir)
    if not folder.is_dir():
        raise SubmitError(
            f"train.init_from: no run {folder.name} in {folder.parent}: name a run folder there, or submit that "
            "run first"
        )
    try:
        states = pipeline_status.step_states(PathsConfig(output_dir=str(folder)).logs_dir, slurm)
    except pipeline_status.SlurmUnreachable as exc:
        raise SubmitError(f"cannot tell whether train.init_from's run {folder} still runs ({exc}): try again") from None
    merge = next((state for state in states if state.step == INIT_STEP and state.active), None)
    if merge:
        return merge.job
    missing = model_files.missing_parts(model) if model.is_dir() else [model.name + "/"]
    if missing:
        raise SubmitError(
            f"train.init_from: run {folder} has no merged model (lacks {', '.join(missing)}) and no {INIT_STEP} job "
            "queued or running: submit that run (through merge) first"
        )
    return None


def move_aside(facts: RunFacts, outputs: list[Path]) -> Path | None:
    """Move ``outputs`` into <run>/replaced/<UTC time>/, each with one rename (same file system): every
    output is either still in place or moved whole, never half."""
    if not outputs:
        return None
    target = facts.output_dir / REPLACED_FOLDER / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target.mkdir(parents=True)  # an existing one (two submissions in a second) is refused here
    for path in outputs:
        os.rename(path, target / path.name)
    print(f"moved aside: {', '.join(p.name for p in outputs)} -> {target}", flush=True)
    return target


def submit(
    facts: RunFacts,
    first: str,
    env: dict[str, str],
    *,
    smoke_stage: bool = True,
    replace_outputs: bool = False,
    last: str | None = None,
) -> list[StepJob]:
    """Submit the pipeline from step `first` through `last` (None: to the end), after a smoke stage unless
    ``smoke_stage`` is off; the record keeps the earlier steps' jobs."""
    with one_chain(facts):
        wanted = pipeline_jobs(first, facts.run, last)  # a --to before --from refused before anything moves
        move_aside(facts, check_earlier_outputs(facts, first, replace=replace_outputs))
        kept = [
            job
            for job in pipeline_status.read_record(facts.logs_dir)
            if job.step in STEPS and STEPS.index(job.step) < STEPS.index(first)  # (a ladder's steps are not)
        ]
        after = init_run_wait(facts)
        if after:
            print(f"train.init_from: this chain starts after the merge job {after} of {facts.run.train.init_from}")
        claim_id = capacity_chain.claim_for_chain(facts, env)  # a group that scales with runs: its nodes first
        jobs = [capacity_chain.wait_job(facts), *wanted] if claim_id else wanted
        try:
            submitted = submit_chain(facts, jobs, env, kept=kept, smoke_stage=smoke_stage, after=after)
        except BaseException:
            capacity_chain.give_back_now(claim_id, env)
            raise
        capacity_chain.submit_release(facts, claim_id, submitted, env)
    return submitted


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    parser.add_argument(
        "--to",
        dest="last",
        choices=STEPS,
        help="stop after this step, its smoke stage with it (default: the last step the run asks for)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    parser.add_argument(
        REPLACE_FLAG,
        dest="replace_outputs",
        action="store_true",
        help="a chain that trains (e.g. --from train with more steps) into a run folder holding an earlier "
        f"training's {', '.join(TRAINED_OUTPUTS)}, or a finished run's checkpoints with other values of the keys "
        f"that change what it learns: move them aside into <run>/{REPLACED_FOLDER}/<time>/ first (without it, "
        "submit refuses)",
    )
    parser.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the smoke stage (every step on <run>/smoke with a few training steps, then the time "
        "estimate) that otherwise runs before the long steps: a defect in a late step then shows only after "
        "the long training",
    )
    parser.add_argument(
        "--wait", action="store_true", help="after submitting, follow the steps until the pipeline ends"
    )
    parser.add_argument(
        "--account",
        default="",
        help="the Slurm account to run under (default: your association's, i.e. your team's; docs/teams.md)",
    )
    parser.add_argument("--qos", default="", help="the QOS to run under (default: the account's default QOS)")
    parser.add_argument(
        "--poll", type=float, default=10.0, help="seconds between checks with --wait (default: %(default)s)"
    )
    return parser.parse_args(argv)


# What the status command needs from this shell beyond the config: where Slurm is (a local cluster's
# slurm.conf) and the folders the config's ${HPL_...} paths expand to.
HINT_VARIABLES = re.compile(r"\$\{(HPL_[A-Z_]+)")


def status_hint(facts: RunFacts, env: dict[str, str]) -> str:
    """The status command as one line that works when pasted into a fresh shell: this interpreter, the
    payloads on PYTHONPATH, SLURM_CONF and the HPL_* folders the config names, where they are set."""
    names = ["SLURM_CONF", *dict.fromkeys(HINT_VARIABLES.findall(facts.config.read_text()))]
    values = [(name, env[name]) for name in names if env.get(name)] + [("PYTHONPATH", str(PAYLOADS_DIR))]
    command = [sys.executable, "-m", "llm_pipeline.submit", "status", "--config", str(facts.config)]
    return " ".join([*(f"{name}={shlex.quote(value)}" for name, value in values), shlex.join(command)])


def print_estimate(facts: RunFacts) -> bool:
    """The smoke run's estimate, when its job wrote one; False when there is none (yet)."""
    found = estimate.read_estimate(facts.logs_dir)
    if not found:
        return False
    print(f"estimate from the smoke run ({facts.logs_dir / estimate.ESTIMATE_FILE}):")
    for line in estimate.describe(found):
        print(f"  {line}", flush=True)
    return True


def report(facts: RunFacts, states: list[pipeline_status.StepState], *, estimate_shown: bool = False) -> int:
    for line in pipeline_status.describe(states):
        print(line)
    if not estimate_shown and any(s.step == smoke.ESTIMATE_STEP for s in states):
        print_estimate(facts)
    return 0 if pipeline_status.verdict(states)[0] in ("COMPLETED", "RUNNING") else 1


def follow(facts: RunFacts, poll_s: float) -> tuple[list[pipeline_status.StepState], bool]:
    """--wait: every state change as it happens, and the estimate as soon as the estimate job finished,
    before the long steps run; the final states, and whether the estimate was shown (once is enough)."""
    shown = False

    def echo(line: str) -> None:
        nonlocal shown
        print(line, flush=True)
        if not shown and re.search(rf"\] {smoke.ESTIMATE_STEP} +COMPLETED ", line):
            shown = print_estimate(facts)

    states = pipeline_status.wait(facts.logs_dir, slurm, poll_s=poll_s, echo=echo)
    return states, shown


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_submitter(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    facts = read_run_facts(args.config, env)
    ladder = args.action == "ladder"
    rungs = facts.run.torchtitan.rungs if ladder else ()
    env.update(partition_environment(facts, env, ladder=ladder, rungs=rungs))
    # The latest deploy's image and runtime (FSx payloads) win over the node profile's.
    env.update(deploy_facts.read_deploy_facts(PAYLOADS_DIR, partition=env.get("HPL_PARTITION")))
    check_runtime_sees(facts, env)
    if args.action != "status" and facts.run is not None:
        grpo = facts.run.train.objective == "grpo"
        serving_image.check_serving(serving_image.vllm_uses(facts.run), env, grpo=grpo)
    if args.action == "status":
        if not pipeline_status.read_record(facts.logs_dir):
            raise SubmitError(f"no pipeline submitted for {facts.output_dir} (no {facts.logs_dir}/pipeline.json)")
        return report(facts, pipeline_status.states_retrying(facts.logs_dir, slurm))
    env.update(accounts.account_environment(slurm, account=args.account, qos=args.qos))
    if args.dry_run:
        if args.action == "ladder":
            ladder_submit.dry_run(facts, env, smoke_stage=args.smoke)
        else:
            jobs = pipeline_jobs(args.first, facts.run, args.last)
            for path in check_earlier_outputs(facts, args.first, replace=args.replace_outputs):
                print(f"# first: move {path} aside into {facts.output_dir / REPLACED_FOLDER}/<time>/")
            try:
                after = init_run_wait(facts)
            except SubmitError as exc:  # a dry run away from the cluster (hpctl's) has no run folders to find
                print(f"# at submit: {exc}")
                after = None
            dry_run(facts, jobs, env, smoke_stage=args.smoke, after=after)
        print(f"# {accounts.describe(env)}", file=sys.stderr)  # stdout stays the script
        return 0
    require_sbatch()
    print(accounts.describe(env), flush=True)
    if args.action == "ladder":
        ladder_submit.submit(facts, env, smoke_stage=args.smoke)
    else:
        submit(facts, args.first, env, smoke_stage=args.smoke, replace_outputs=args.replace_outputs, last=args.last)
    print(f"logs: {facts.logs_dir / StepLog('<step>', '<job>').name}")
    print(f"status: {status_hint(facts, env)}", flush=True)
    if args.wait:
        states, estimate_shown = follow(facts, args.poll)
        return report(facts, states, estimate_shown=estimate_shown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
