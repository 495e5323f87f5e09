"""How long the long steps will take, from what the smoke stage measured (the chain's `estimate` job).

    python3 -m llm_pipeline.jobs.estimate --run-dir <run folder> --config <run config>

Runs after the smoke stage (jobs/smoke.py) and before the first long step. For each long job of the
submission record (<run>/logs/pipeline.json):
- a training job (its smoke copies printed step lines): the steady-state step time is the median
  over every smoke log's step lines but its first (the first carries the model load, graph
  compilation or the resume). The fine-tuning trainer (training/callbacks.py) prints
  ``step 3/4 | loss 1.2 | lr 2.0e-05 | 3.70 samples/s | 15155 tokens/s | eta 0:00:01``: sequences per
  step (per-device batch x gradient accumulation x the data-parallel replicas the trainer printed)
  over samples/s. torchtitan prints ``[titan] 2026-01-01 10:00:01,250 - root - INFO - step:  3  loss:
  ...`` through its logger: the time between two logged steps over the steps between them. The long
  job takes its start-up (the first smoke copy's run time less its steps) plus its steps
  (train.max_steps, or train.epochs x the optimizer steps per epoch of the run's layout, padded, packed or
  blocks, in <run>/data/stats.json: run_files.DataStats; a ladder rung: torchtitan.steps) times that step time;
- any other job: its smoke copy's run time (precompile's few steps, consolidation, merge and
  generation do not scale with the step count).
Node-hours are each job's duration times its nodes. Prints the table and writes
<run>/logs/estimate.json; `submit status`, `submit --wait` and hpctl show it, hpctl with the price.
Stdlib only (the node's python3).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from llm_pipeline import config as run_config
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import capacity, pipeline_status, smoke
from llm_pipeline.run_files import (
    DATA_STATS_FILE,
    ESTIMATE_FILE,
    DataStats,
    Estimate,
    ProgressLine,
    ReplicasLine,
    StepEstimate,
    StepVerdict,
    TitanMetricLine,
    data_layout,
)

RUNG_PREFIX = "rung-"  # the ladder's training jobs (ladder_submit)
TRAIN_STEP = "train"  # the pipeline's and the sweep's training job (submit.TRAINING_STEPS)
BILLING_NOTE = (
    "HyperPod bills every node of the cluster while the cluster exists, busy or idle: these node-hours "
    "are what the run occupies, not what it adds to the bill"
)
SCALED_BILLING_NOTE = (
    "the partition's group scales with runs: its nodes exist while chains claim them, so these node-hours are "
    "what the run adds to the bill (plus the wait for its nodes to arrive); the floor is billed regardless"
)
JOB_BILLING_NOTE = (
    "a training job is billed per instance-second while it runs: node-hours x the instance type's on-demand "
    "training price (`hpctl job status` shows the cost so far)"
)


class EstimateError(PipelineError, RuntimeError):
    """The smoke run's logs do not hold what the estimate needs; the message names the file."""


@dataclass(frozen=True)
class SmokeLog:
    run_seconds: float
    trained_steps: int  # from the first logged step to the last
    samples_per_second: list[float]  # the fine-tuning trainer's, per step line after the first
    replicas: int | None
    step_seconds: list[float]  # torchtitan's, between logged steps after the first


def _titan_step_seconds(stamps: dict[int, datetime]) -> list[float]:
    """Seconds per step between consecutive logged steps (each step's first line: every rank prints one),
    leaving out the interval after the first logged step where there are more (the job's first step,
    with its load and compilation, ends before the first stamp; the next may still recompile). A job
    that logged two steps (a smoke rung stopped after its save, or the one resumed from it) keeps its one."""
    steps = sorted(stamps)
    pairs = list(itertools.pairwise(steps))
    return [(stamps[b] - stamps[a]).total_seconds() / (b - a) for a, b in (pairs[1:] or pairs)]


def read_smoke_log(path: Path, name: str) -> SmokeLog:
    text = path.read_text(errors="replace") if path.is_file() else ""
    run_seconds, replicas, events, stamps = None, None, [], {}
    for line in text.splitlines():
        if (verdict := StepVerdict.parse(line)) and verdict.step == name and verdict.state == "COMPLETED":
            run_seconds = float(verdict.seconds)
        elif found := ReplicasLine.parse(line):
            replicas = found.replicas
        elif progress := ProgressLine.parse(line):
            events.append((progress.step, progress.samples_per_second))
        elif (titan := TitanMetricLine.parse(line)) and titan.time is not None:
            stamps.setdefault(titan.step, titan.time)
    if run_seconds is None:
        raise EstimateError(f"{path} does not say `== {name}: COMPLETED (exit 0) after N s`: did the smoke job finish?")
    logged = [step for step, _ in events] or sorted(stamps)
    trained = logged[-1] - logged[0] + 1 if logged else 0
    return SmokeLog(run_seconds, trained, [samples for _, samples in events[1:]], replicas, _titan_step_seconds(stamps))


def long_steps(cfg: RunConfig, run_dir: Path, step: str) -> tuple[int, str]:
    """(optimizer steps of the long training job ``step``, where the number comes from)."""
    if step.startswith(RUNG_PREFIX):
        return cfg.torchtitan.steps, "torchtitan.steps"
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps, "train.max_steps"
    stats_file = run_dir / "data" / DATA_STATS_FILE
    try:
        stats = DataStats.from_json(stats_file.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        raise EstimateError(f"{stats_file} is missing or unreadable: the data step writes it") from None
    wanted = data_layout(cfg.data.blocks, cfg.data.packing)
    if stats.mode != wanted:
        raise EstimateError(
            f"{stats_file} describes {stats.mode} sequences and the run trains {wanted} ones: run the data step again"
        )
    layout, epochs = stats.trained, cfg.train.epochs
    return math.ceil(epochs * layout.optimizer_steps_per_epoch), (
        f"train.epochs {epochs:g} x {layout.optimizer_steps_per_epoch} steps per epoch on {layout.replicas} "
        f"data-parallel replica(s) ({stats_file})"
    )


def sequences_per_step(cfg: RunConfig, replicas: int) -> int:
    return cfg.train.per_device_batch_size * cfg.train.gradient_accumulation_steps * replicas


def is_training(step: str) -> bool:
    """The long jobs whose duration grows with their step count: the pipeline's train, a ladder rung."""
    return step == TRAIN_STEP or step.startswith(RUNG_PREFIX)


def estimate_job(job: pipeline_status.StepJob, copies: list[pipeline_status.StepJob], cfg: RunConfig, run_dir: Path):
    """(StepEstimate, seconds per step or None) of one long job from its smoke copies' logs."""
    if not copies and not smoke.copied(job.step):
        return StepEstimate(job.step, job.nodes, 0.0, smoke.NOT_COPIED[job.step]), None
    if not copies:
        raise EstimateError(f"no smoke copy of {job.step} in {pipeline_status.record_path(run_dir / 'logs')}")
    logs = [read_smoke_log(Path(copy.log), copy.step) for copy in copies]
    rates = [rate for log in logs for rate in log.samples_per_second]
    titan = [seconds for log in logs for seconds in log.step_seconds]
    if not is_training(job.step):  # precompile's few steps print step lines too (on Neuron): they do not scale
        return StepEstimate(job.step, job.nodes, logs[-1].run_seconds, "its smoke run's duration"), None
    if titan:
        step_seconds = statistics.median(titan)
    elif rates:
        replicas = next((log.replicas for log in logs if log.replicas), None)
        if replicas is None:
            raise EstimateError(f"{copies[0].log} does not name its data-parallel replicas (`training steps ...` line)")
        step_seconds = sequences_per_step(cfg, replicas) / statistics.median(rates)
    else:
        return StepEstimate(job.step, job.nodes, logs[-1].run_seconds, "its smoke run's duration"), None
    steps, source = long_steps(cfg, run_dir, job.step)
    start_up = max(0.0, logs[0].run_seconds - logs[0].trained_steps * step_seconds)
    basis = f"{start_up:.0f} s start-up + {steps} steps ({source}) x {step_seconds:.3f} s/step measured in smoke"
    split = run_config.rollout_split(cfg)
    if split:  # every node of the allocation is billed, the rollout server's too
        basis += f"; {split}"
    return StepEstimate(job.step, job.nodes, start_up + steps * step_seconds, basis), step_seconds


def estimate(run_dir: Path, config: Path, *, note: str = BILLING_NOTE) -> Estimate:
    record = pipeline_status.read_record(run_dir / "logs")
    names = [job.step for job in record]
    if smoke.ESTIMATE_STEP not in names:
        raise EstimateError(f"{pipeline_status.record_path(run_dir / 'logs')} has no estimate job: nothing to estimate")
    long = record[names.index(smoke.ESTIMATE_STEP) + 1 :]
    rows, step_times = [], {}
    for job in long:
        # Its smoke copies: the same step on as many nodes (a sweep has a train job per node count).
        copies = [
            c for c in record if smoke.is_smoke(c.step) and smoke.long_step(c.step) == job.step and c.nodes == job.nodes
        ]
        row, step_seconds = estimate_job(job, copies, run_config.load(job.config or config), run_dir)
        rows.append(row)
        if step_seconds is not None:
            # A sweep trains once per node count: its keys say the nodes (train@2).
            repeated = sum(other.step == job.step for other in long) > 1
            step_times[f"{job.step}@{job.nodes}" if repeated else job.step] = step_seconds
    # the partition: hpctl prices its instance type
    return Estimate(str(config), os.environ.get("HPL_PARTITION", ""), tuple(rows), step_times, note)


def duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def describe(result: Estimate) -> list[str]:
    lines = [f"{'long step':<20} {'nodes':>5} {'duration':>12} {'node-hours':>11}  from"]
    for row in result.steps:
        time = duration(row.seconds)
        lines.append(f"{row.step:<20} {row.nodes:>5} {time:>12} {row.node_hours:>11.3f}  {row.basis}")
    lines.append(
        f"expected: {duration(result.total_seconds)} for the long steps, {result.node_hours:.3f} node-hours "
        "(cost: node-hours x the instance's on-demand price)"
    )
    lines.append(f"note: {result.note}")
    return lines


def read_estimate(logs_dir: Path) -> Estimate | None:
    try:
        return Estimate.from_json((logs_dir / ESTIMATE_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.estimate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run folder (paths.output_dir)")
    parser.add_argument("--config", type=Path, required=True, help="the run config of the long steps")
    parser.add_argument("--training-job", action="store_true", help="inside a SageMaker training job (its billing)")
    args = parser.parse_args(argv)
    try:
        scaled = capacity.group_from_env(os.environ) is not None
        note = JOB_BILLING_NOTE if args.training_job else SCALED_BILLING_NOTE if scaled else BILLING_NOTE
        result = estimate(args.run_dir, args.config, note=note)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    target = args.run_dir / "logs" / ESTIMATE_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(result.to_json())
    tmp.replace(target)
    print("\n".join(describe(result)))
    print(f"written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
