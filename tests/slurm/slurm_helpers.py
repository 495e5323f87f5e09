"""Helpers shared by the Slurm tests: run submit as a user does, wait on files."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline import config
from llm_pipeline.config import PathsConfig, RunConfig
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from llm_pipeline.submit import SHARED_STEPS, STEPS, pipeline_jobs
from tools.rehearse import TINY_SHAPE

REPO = Path(__file__).resolve().parents[2]
# The chain of a run that asks for no benchmark (the tests' tiny configs name no benchmark.tasks), in order.
RUN_STEPS = tuple(job.step for job in pipeline_jobs(STEPS[0], RunConfig()))
# Its long steps, and its smoke stage in order: a smoke copy of each long step, the training's twice (saved, then
# resumed).
LONG_STEPS = [step for step in RUN_STEPS if step not in SHARED_STEPS]
SMOKE_JOBS = [
    f"smoke-{name}" for step in LONG_STEPS for name in ((step, f"{step}-resume") if step == "train" else (step,))
]
# The GPU example (payloads/configs/) the newcomer journey rehearses to the end with the user's own records
# (tests/docs/test_newcomer_journey.py): its chain there asserts example_trained, so
# test_gpu_examples_rehearsal.py runs the other examples' chains only.
JOURNEY_EXAMPLE = "llama3-8b-lora-g5.toml"


def example_trained(
    name: str, followed: str, run: PathsConfig, through: str = RUN_STEPS[-1], first: str = RUN_STEPS[0]
) -> None:
    """The GPU example ``name`` rehearsed at tiny shape (tools/rehearse.py --tiny) into ``run``, its shaped
    config's paths, ``followed`` what submit --wait printed: every step completed, with the example's own method,
    strategy, packing, optimizer and gradient checkpointing (read back from the steps' logs), and wrote its
    adapter, merged model, answer and report. ``first`` and ``through``: the chain's first and last steps (submit
    --from, --to): the steps after ``through`` were never submitted."""
    own = config.load(REPO / "payloads" / "configs" / name, env={})
    jobs = SubmittedLine.jobs(followed)
    ran = RUN_STEPS[RUN_STEPS.index(first) : RUN_STEPS.index(through) + 1]
    after = RUN_STEPS[RUN_STEPS.index(through) + 1 :]
    assert "pipeline: COMPLETED" in followed and set(ran) <= set(jobs), f"{name}:\n{followed}"
    assert not set(jobs) & set(after), f"{name}:\n{followed}"
    assert not [step for step in after if list(run.logs_dir.glob(f"{step}-*.log"))], name
    logs = {step: (run.logs_dir / f"{step}-{jobs[step]}.log").read_text() for step in ran}
    assert [step for step in ran if f"== {step}: COMPLETED (exit 0)" in logs[step]] == list(ran), name
    train = own.train
    if "prepare" in logs:  # else tests/payloads/test_run_configs.py runs prepare on it (prepare_on_node)
        assert prepare_said(own) <= set(logs["prepare"].splitlines()), name
    assert f"packing is {'on' if own.data.packing else 'off'} (data.packing)" in logs["data"], name
    trained = rf"(?m)^method {train.method}: [\d,]+ trainable parameters \(as expected\); 1 process"
    assert re.search(trained, logs["train"]), name
    assert f"gradient checkpointing {train.gradient_checkpointing}; " in logs["train"], name
    steps = TINY_SHAPE["train", "max_steps"]
    assert [(line.step, line.total) for line in ProgressLine.parse_all(logs["train"])][-1] == (steps, steps), name
    assert (run.adapter_dir / "adapter_model.safetensors").is_file(), name
    assert {"config.json", "model.safetensors"} <= {path.name for path in run.merged_dir.iterdir()}, name
    if through == RUN_STEPS[-1]:
        assert "### Answer" in run.generation_file.read_text() and (run.eval_dir / "report.md").is_file(), name


def prepare_said(own: RunConfig) -> set[str]:
    """The lines the prepare step prints about a run config's method, strategy, scheduler and optimizer."""
    train = own.train
    return {
        f"backend torch: method {train.method}, strategy {own.parallel.strategy}",
        f"lr_scheduler {train.lr_scheduler}, optimizer {train.optimizer}: known to transformers",
    }


def submit(env: dict[str, str], config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """python -m llm_pipeline.submit, as a user runs it."""
    command = [sys.executable, "-m", "llm_pipeline.submit", *args, "--config", str(config)]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "payloads")


def job_lines(dry_run: str) -> list[str]:
    """A dry run's sbatch lines (``<job>_job=$(sbatch ...)``), without its comments."""
    return [line for line in dry_run.splitlines() if "=$(sbatch " in line]


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    """Poll until predicate() is truthy; the timeout only stops a hung test, it asserts nothing about speed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(poll)


def read_png(path: Path) -> None:
    """Open a chart the pipeline wrote: a PNG with something drawn on it (its data is checked in
    tests/payloads, where the figures are built from the same inputs)."""
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100, pixels.shape
    assert (pixels[..., :3].min(axis=-1) < 0.9).mean() > 0.01, f"{path} is blank"
