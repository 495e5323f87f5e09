"""The time estimate reads the step lines our trainer callback prints in the smoke stage and turns the
measured steady-state step time into each long step's duration and node-hours."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from unittest import mock

import pytest
from transformers import TrainerState, TrainingArguments

from llm_pipeline.jobs import estimate, pipeline_status
from llm_pipeline.run_files import DATA_STATS_FILE, DataStats, LayoutStats, StepJob, StepVerdict
from llm_pipeline.training import callbacks
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter
from tools import torchtitan_standin

GA = 4  # one process, per-device batch 1: 4 sequences per optimizer step


class SteppedClock:
    """MetricsLogger's clock (callbacks.time) as the test advances it: a loaded machine's own delays between the
    calls would add to the step time the estimate reads (a 0.5 s step read beyond the test's 5% under make test's
    four workers)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def smoke_training_log(capsys, tmp_path: Path, steps: range, step_seconds: float, first_extra: float) -> str:
    """What the smoke training prints: MetricsLogger's lines, one per step; the first carries ``first_extra``
    seconds of start-up (compilation, the resume)."""
    args = TrainingArguments(output_dir=str(tmp_path / "unused"), per_device_train_batch_size=1,
                             gradient_accumulation_steps=GA, report_to="none")  # fmt: skip
    state = TrainerState(max_steps=steps[-1], is_world_process_zero=True, global_step=steps[0] - 1)
    tokens = TokenCounter(lambda features: features)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    clock = SteppedClock()
    with mock.patch.object(callbacks, "time", clock):
        logger.on_train_begin(args, state, None)
        for step in steps:
            clock.now += step_seconds + (first_extra if step == steps[0] else 0.0)
            tokens.real += 100
            state.global_step = step
            logger.on_log(args, state, None, logs={"loss": 2.0 / step, "learning_rate": 1e-5})
    return capsys.readouterr().out


def write_job(run: Path, step: str, job: str, text: str, seconds: int, nodes: int = 1) -> StepJob:
    folder = run / "smoke" / "logs" if step.startswith("smoke-") else run / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{step}-{job}.log"
    verdict = StepVerdict(step, "COMPLETED", 0, seconds, "2026-01-01T00:00:00Z").format()
    log.write_text(f"== {step}: job {job}\n{text}{verdict}\n")
    return StepJob(step=step, job=job, log=str(log), nodes=nodes)


def smoke_run(capsys, tmp_path: Path, train_toml: str) -> tuple[Path, Path]:
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text(f"[train]\nper_device_batch_size = 1\ngradient_accumulation_steps = {GA}\n{train_toml}")
    jobs = [
        write_job(run, "data", "1", "", 30),
        write_job(run, "smoke-train", "2", smoke_training_log(capsys, tmp_path, range(1, 3), 0.5, 30.0), 45, 2),
        write_job(run, "smoke-train-resume", "3", smoke_training_log(capsys, tmp_path, range(3, 5), 0.5, 8.0), 20, 2),
        write_job(run, "smoke-consolidate", "4", "adapter written\n", 12),
        StepJob(step="estimate", job="5", log=str(run / "logs" / "estimate-5.log")),
        StepJob(step="train", job="6", log=str(run / "logs" / "train-6.log"), nodes=2),
        StepJob(step="consolidate", job="7", log=str(run / "logs" / "consolidate-7.log")),
    ]
    pipeline_status.write_record(run / "logs", config, jobs)
    return run, config


def test_measured_step_time_gives_duration_and_node_hours(capsys, tmp_path):
    run, config = smoke_run(capsys, tmp_path, "max_steps = 1000\n")
    result = estimate.estimate(run, config)
    step_seconds = result.seconds_per_step["train"]
    assert step_seconds == pytest.approx(0.5, rel=0.05)  # the first line of each smoke log left out
    train, consolidate = result.steps
    # start-up: the saving smoke run's 45 s less its 2 steps; then 1000 steps at the measured time
    assert train.seconds == pytest.approx(45 - 2 * step_seconds + 1000 * step_seconds)
    assert train.node_hours == pytest.approx(train.seconds * 2 / 3600)
    assert "1000 steps (train.max_steps)" in train.basis
    assert consolidate.seconds == 12 and consolidate.node_hours == pytest.approx(12 / 3600)
    assert result.total_seconds == pytest.approx(train.seconds + 12)
    assert result.node_hours == pytest.approx(train.node_hours + 12 / 3600)
    lines = estimate.describe(result)
    assert any(line.startswith("train ") and "0:09:04" in line for line in lines)  # 45 - 1 + 500 s
    assert "while the cluster exists" in lines[-1]


@pytest.mark.parametrize(
    ("data_toml", "layout"), [("packing = true\n", "packed"), ("", "padded"), ("blocks = true\n", "blocks")]
)
def test_epochs_use_the_data_steps_count_of_the_runs_layout(capsys, tmp_path, data_toml, layout):
    run, config = smoke_run(capsys, tmp_path, f"epochs = 2.5\n[data]\n{data_toml}")
    measured = {"padded": 90, "packed": 40} if layout != "blocks" else {"blocks": 30}
    layouts = {name: LayoutStats(steps * 4, 0.1, steps, 2) for name, steps in measured.items()}
    (run / "data").mkdir()
    (run / "data" / DATA_STATS_FILE).write_text(DataStats(layout, layouts, {"examples": 9}).to_json())
    train = estimate.estimate(run, config).steps[0]
    steps = measured[layout]
    assert (
        f"{math.ceil(2.5 * steps)} steps (train.epochs 2.5 x {steps} steps per epoch on 2 data-parallel" in train.basis
    )
    other = "padded" if layout == "packed" else "packed"
    (run / "data" / DATA_STATS_FILE).write_text(
        DataStats(other, layouts | {other: layouts[next(iter(layouts))]}).to_json()
    )
    with pytest.raises(estimate.EstimateError, match=f"describes {other} sequences and the run trains {layout}"):
        estimate.estimate(run, config)


def test_main_writes_the_estimate_and_an_unfinished_smoke_log_is_named(capsys, tmp_path):
    run, config = smoke_run(capsys, tmp_path, "max_steps = 10\n")
    assert estimate.main(["--run-dir", str(run), "--config", str(config)]) == 0
    assert estimate.read_estimate(run / "logs").steps[0].step == "train"
    log = run / "smoke" / "logs" / "smoke-consolidate-4.log"
    log.write_text("== smoke-consolidate: job 4\n")
    assert estimate.main(["--run-dir", str(run), "--config", str(config)]) == 2
    assert f"{log} does not say `== smoke-consolidate: COMPLETED" in capsys.readouterr().err


def titan_log(start: float, step_seconds: float, first_extra: float, steps: range = range(1, 5)) -> str:
    """A smoke rung's log: torchtitan's metric lines (the stand-in's format) through its logger's format,
    two ranks per step, one step every ``step_seconds`` after a first step ``first_extra`` longer."""
    formatter = torchtitan_standin.build_logger().handlers[0].formatter
    lines, now = [], start
    for step in steps:
        now += step_seconds + (first_extra if step == steps[0] else 0.0)
        for rank in range(2):
            record = logging.LogRecord("root", logging.INFO, __file__, 0, "", None, None)
            record.msg = torchtitan_standin.metric_line(step, 9.0 / step, 1.0, 1.0, 1.0, 1000.0 + rank, 1.0, 1.0)
            record.created, record.msecs = now + rank * 0.01, ((now + rank * 0.01) % 1) * 1000
            lines.append(formatter.format(record))
    return "\n".join(lines) + "\n"


def test_a_ladder_rung_is_timed_from_torchtitans_logged_steps(tmp_path):
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text("[torchtitan]\nsteps = 2000\n")
    jobs = [
        write_job(run, "smoke-rung-baseline", "2", titan_log(1_700_000_000.0, 1.5, 40.0), 70, 4),
        StepJob(step="estimate", job="3", log=str(run / "logs" / "estimate-3.log")),
        StepJob(step="rung-baseline", job="4", log=str(run / "logs" / "rung-baseline-4.log"), nodes=4),
    ]
    (run / "logs").mkdir()
    pipeline_status.write_record(run / "logs", config, jobs)
    result = estimate.estimate(run, config)
    assert result.seconds_per_step["rung-baseline"] == pytest.approx(1.5, abs=0.01)
    rung = result.steps[0]
    assert "2000 steps (torchtitan.steps)" in rung.basis
    assert rung.seconds == pytest.approx(70 - 4 * 1.5 + 2000 * 1.5, abs=30)
    assert rung.node_hours == pytest.approx(rung.seconds * 4 / 3600)


def test_a_resumed_smoke_rung_is_timed_from_both_of_its_jobs(tmp_path):
    """A rung smoke-tested with a resume logs steps 1-2 in one job and 3-4 in the next: each job's one
    interval is a step after its first (load, compilation), and the first job's run time gives the start-up."""
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text("[torchtitan]\nsteps = 1000\n")
    jobs = [
        write_job(run, "smoke-rung-fp8_allgather", "2", titan_log(1_700_000_000.0, 2.0, 40.0, range(1, 3)), 60, 2),
        write_job(
            run, "smoke-rung-fp8_allgather-resume", "3", titan_log(1_700_000_100.0, 2.2, 50.0, range(3, 5)), 70, 2
        ),
        StepJob(step="estimate", job="4", log=str(run / "logs" / "estimate-4.log")),
        StepJob(step="rung-fp8_allgather", job="5", log=str(run / "logs" / "rung-fp8_allgather-5.log"), nodes=2),
    ]
    (run / "logs").mkdir()
    pipeline_status.write_record(run / "logs", config, jobs)
    result = estimate.estimate(run, config)
    assert result.seconds_per_step["rung-fp8_allgather"] == pytest.approx(2.1, abs=0.01)  # median of 2.0, 2.2
    assert result.steps[0].seconds == pytest.approx(60 - 2 * 2.1 + 1000 * 2.1, abs=1)


def test_precompile_takes_its_smoke_run_time_though_it_prints_step_lines(capsys, tmp_path):
    """On Neuron `train --precompile` prints its few steps' lines: its long copy takes the smoke copy's run time."""
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text(f"[train]\nper_device_batch_size = 1\ngradient_accumulation_steps = {GA}\nmax_steps = 500\n")
    jobs = [
        write_job(run, "smoke-precompile", "2", smoke_training_log(capsys, tmp_path, range(1, 4), 0.5, 30.0), 95, 2),
        StepJob(step="estimate", job="3", log=str(run / "logs" / "estimate-3.log")),
        StepJob(step="precompile", job="4", log=str(run / "logs" / "precompile-4.log"), nodes=2),
    ]
    (run / "logs").mkdir()
    pipeline_status.write_record(run / "logs", config, jobs)
    (row,) = estimate.estimate(run, config).steps
    assert (row.seconds, row.basis) == (95, "its smoke run's duration")


def test_a_run_on_a_group_that_scales_with_runs_is_told_its_node_hours_are_its_own(capsys, tmp_path, monkeypatch):
    run, config = smoke_run(capsys, tmp_path, "max_steps = 10\n")
    monkeypatch.setenv("HPL_SCALE_WITH_RUNS", "1")
    assert estimate.main(["--run-dir", str(run), "--config", str(config)]) == 0
    assert estimate.read_estimate(run / "logs").note == estimate.SCALED_BILLING_NOTE
    monkeypatch.delenv("HPL_SCALE_WITH_RUNS")
    assert estimate.main(["--run-dir", str(run), "--config", str(config)]) == 0
    assert estimate.read_estimate(run / "logs").note == estimate.BILLING_NOTE
