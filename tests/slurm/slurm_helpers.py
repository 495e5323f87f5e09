"""Helpers shared by the Slurm tests: run submit as a user does, wait on files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.submit import STEPS, pipeline_jobs

REPO = Path(__file__).resolve().parents[2]
# The chain of a run that asks for no benchmark (the tests' tiny configs name no benchmark.tasks), in order.
RUN_STEPS = tuple(job.step for job in pipeline_jobs(STEPS[0], RunConfig()))


def submit(env: dict[str, str], config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """python -m llm_pipeline.submit, as a user runs it."""
    command = [sys.executable, "-m", "llm_pipeline.submit", *args, "--config", str(config)]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "payloads")


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
