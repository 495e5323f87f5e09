"""Scaling sweep: train one run config at several node counts on Slurm, then report the scaling.

    python3 -m llm_pipeline.sweep --config configs/llama2-7b-full.toml --nodes 1,2,4 [--steps 40] [--no-smoke]
        [--dry-run] [--wait]

Every node count trains the same config for ``--steps`` optimizer steps at the same global batch
(gradient accumulation shrinks as nodes grow; jobs/sweep_plan), each in its own folder
``<run folder>/<--name>/nodes-<n>/`` whose ``data`` links to the run's prepared data. One chain of
sbatch jobs, each after the previous one succeeded: data (unless the run's data is already
prepared), then per node count precompile and train (the usual step scripts), then the report
(jobs/scaling_report: ``scaling.md`` and ``scaling.json`` in the sweep folder). Unless --no-smoke,
a smoke stage comes first (after data): every node count's precompile and a SMOKE_STEPS-step train
on ``<sweep>/smoke/nodes-<n>/``, the smoke sweep's report, then the estimate (jobs/smoke.py,
chain.with_smoke_stage; docs/scaling.md says why every node count). Works for every engine: the
steps pick the backend from the run config as they always do. Stdlib only (the controller's
python3), like submit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from llm_pipeline import __version__
from llm_pipeline import config as run_config
from llm_pipeline.jobs import deploy_facts, partitions, pipeline_status, smoke
from llm_pipeline.jobs.chain import (
    DRY_RUN_OPENING,
    PAYLOADS_DIR,
    ChainJob,
    SubmitError,
    check_runtime_sees,
    partition_environment,
    require_sbatch,
    run_submitter,
    sbatch_command,
    slurm,
    submit_jobs,
    with_smoke_stage,
)
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts, read_run_facts
from llm_pipeline.jobs.sweep_plan import SweepPoint, plan_sweep, read_base, training_summary, write_plan
from llm_pipeline.run_files import STATE_DIR
from llm_pipeline.submit import print_estimate, step_job

REPORT_STEP = "sweep_report"  # payloads/slurm/sweep_report.sbatch
REPORT_JOB = ChainJob(step=REPORT_STEP, script=f"{REPORT_STEP}.sbatch")


def link_data(points: list[SweepPoint], data_dir: Path) -> None:
    """Each point trains on the run's prepared data (its own folder would hold none)."""
    for point in points:
        link = Path(point.output_dir) / "data"
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.symlink_to(data_dir, target_is_directory=True)


def clear_checkpoints(points: list[SweepPoint]) -> None:
    """A point must train from step 0: an earlier sweep's checkpoint would be resumed instead."""
    for point in points:
        checkpoints = Path(point.output_dir) / "checkpoints"
        if checkpoints.is_dir():
            print(f"note: removing {checkpoints} from an earlier sweep (each point trains from step 0)", flush=True)
            shutil.rmtree(checkpoints)


def point_facts(point: SweepPoint) -> RunFacts:
    return RunFacts(config=Path(point.config), output_dir=Path(point.output_dir), nodes=point.nodes)


def sweep_facts(base: RunFacts, sweep_dir: Path) -> RunFacts:
    """The report's (and the estimate's) run: the sweep folder, on one node."""
    return RunFacts(config=base.config, output_dir=sweep_dir, nodes=1)


def chain(
    base: RunFacts, points: list[SweepPoint], sweep_dir: Path, with_data: bool
) -> list[tuple[ChainJob, RunFacts]]:
    """(job, the facts it runs with), in submission order, before any smoke stage."""
    jobs: list[tuple[ChainJob, RunFacts]] = [(step_job("data"), base)] if with_data else []
    train = dataclasses.replace(step_job("train"), resumes=False)  # a point saves no checkpoint to resume from
    for point in points:
        jobs += [(step_job("precompile"), point_facts(point)), (train, point_facts(point))]
    jobs.append((REPORT_JOB, sweep_facts(base, sweep_dir)))
    return jobs


def plan_smoke(base: RunFacts, backend: str, points: list[SweepPoint], sweep_dir: Path) -> list[SweepPoint]:
    """The smoke sweep: every point again in <sweep>/smoke/nodes-<n>/, SMOKE_STEPS steps, a line per step
    (a fresh folder: written anew at each submission)."""
    folder = sweep_dir / smoke.SMOKE_FOLDER
    if folder.exists():
        shutil.rmtree(folder)
    return plan_sweep(
        base,
        backend,
        folder,
        [point.nodes for point in points],
        steps=smoke.SMOKE_STEPS,
        logging_steps=1,
        overrides={("train", "profile"): ""},  # the cut run never reaches a profiler window
    )


def staged(
    base: RunFacts,
    points: list[SweepPoint],
    smoke_points: list[SweepPoint],
    sweep_dir: Path,
    planned: list[tuple[ChainJob, RunFacts]],
) -> list[tuple[ChainJob, RunFacts]]:
    """``planned`` after its smoke stage: each point's precompile and train on its smoke point (same nodes,
    layout and partition), the smoke sweep's report, the estimate, then the long chain (chain.with_smoke_stage)."""
    runs = {point_facts(p): point_facts(s) for p, s in zip(points, smoke_points, strict=True)}
    runs[sweep_facts(base, sweep_dir)] = sweep_facts(base, sweep_dir / smoke.SMOKE_FOLDER)
    return with_smoke_stage(planned, lambda facts: (runs[facts], runs[facts]), sweep_facts(base, sweep_dir))


def submit_chain(planned: list[tuple[ChainJob, RunFacts]], env: dict[str, str]) -> list[StepJob]:
    return submit_jobs(planned, env, label=lambda job, facts: f"{job.step} ({facts.nodes} node(s))")


def wait(jobs: list[StepJob], poll_s: float) -> None:
    ids = ",".join(job.job for job in jobs)
    while True:
        out = slurm(["squeue", "-h", "-j", ids, "-o", "%i"])
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(poll_s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", required=True, help="run config (TOML): its node count and batch are the base")
    parser.add_argument("--nodes", required=True, help="comma-separated node counts, e.g. 1,2,4")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per node count (default: %(default)s)")
    parser.add_argument(
        "--logging-steps", type=int, default=5, help="steps between throughput lines (default: %(default)s)"
    )
    parser.add_argument("--name", default="sweep", help="sweep folder inside the run folder (default: %(default)s)")
    parser.add_argument(
        "--dry-run", action="store_true", help="write the point configs, print the jobs, submit nothing"
    )
    parser.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the smoke stage (every node count trains a few steps on <sweep>/smoke first, reported, then "
        "the time estimate) that otherwise runs before the long points: a node count that cannot start then "
        "fails only after the smaller points' long runs",
    )
    parser.add_argument("--wait", action="store_true", help="wait for the chain and print the report")
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between checks with --wait")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_submitter(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    try:
        counts = [int(part) for part in args.nodes.split(",") if part.strip()]
    except ValueError:
        raise SubmitError(f"--nodes {args.nodes!r}: give node counts separated by commas, e.g. 1,2,4") from None
    if not counts or args.steps < 2 or args.logging_steps < 1:
        raise SubmitError("give at least one node count, --steps >= 2 and --logging-steps >= 1")
    base = read_run_facts(args.config, env)
    # The same partition, image and runtime as submit would give this run (one config, one partition).
    env.update(partition_environment(base, env))
    env.update(deploy_facts.read_deploy_facts(PAYLOADS_DIR, partition=env.get("HPL_PARTITION")))
    check_runtime_sees(base, env)
    sweep_dir = base.output_dir / args.name
    backend = partitions.backend_on(base.backend, env)
    points = plan_sweep(base, backend, sweep_dir, counts, steps=args.steps, logging_steps=args.logging_steps)
    for point in points:
        print(
            f"{point.nodes} node(s): gradient accumulation {point.gradient_accumulation_steps}, global batch "
            f"{point.global_batch}, config {point.config}",
            flush=True,
        )
        print(f"  train: {training_summary(run_config.load(point.config, env))}", flush=True)
    data_dir = base.output_dir / "data"
    with_data = not (data_dir.is_dir() and any(data_dir.iterdir()))
    if not with_data:
        print(f"using the prepared data in {data_dir} (delete it to prepare it again)", flush=True)
    planned = chain(base, points, sweep_dir, with_data)
    if args.smoke:
        smoke_points = plan_smoke(base, backend, points, sweep_dir)
        planned = staged(base, points, smoke_points, sweep_dir, planned)
    else:
        print(f"note: {smoke.NO_SMOKE_RISK}", flush=True)
    if args.dry_run:
        print(f"{DRY_RUN_OPENING} The jobs, each after the previous one:")
        for job, facts in planned:
            print(shlex.join(sbatch_command(job, facts, None, env)))
        return 0
    require_sbatch()
    for facts in {facts for _, facts in planned}:  # sbatch cannot open a log in a folder that does not exist
        (facts.logs_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
    base_facts = read_base(base.run, backend)
    if args.smoke:
        link_data(smoke_points, data_dir)
        write_plan(sweep_dir / smoke.SMOKE_FOLDER, base.config, base_facts, smoke_points, {"chain": []})
        print(
            f"smoke stage: every node count trains {smoke.SMOKE_STEPS} steps on {sweep_dir / smoke.SMOKE_FOLDER} "
            "first, with its report and the time estimate; the long points start only if it passes",
            flush=True,
        )
    link_data(points, data_dir)
    clear_checkpoints(points)
    write_plan(sweep_dir, base.config, base_facts, points, {"chain": []})  # before any job can read it
    submitted = submit_chain(planned, env)
    # The estimate job reads the record: each long point's job beside its smoke copy on as many nodes.
    pipeline_status.write_record(sweep_dir / "logs", base.config, submitted)
    write_plan(sweep_dir, base.config, base_facts, points, {"chain": [vars(job) for job in submitted]})
    print(f"report: {sweep_dir / 'scaling.md'} (written by the last job)")
    if args.wait:
        wait(submitted, args.poll)
        if args.smoke:
            print_estimate(sweep_facts(base, sweep_dir))
        report = sweep_dir / "scaling.md"
        if not report.is_file():
            raise SubmitError(f"the sweep ended without a report; see the logs in {submitted[-1].log}")
        print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
