"""Run a torchtitan trainer with its metric lines published for node exporter (observability = prometheus).

    python -m llm_pipeline.training.torchtitan.live_metrics MODULE --job.config_file <run>/ladder/<rung>/job.toml

torchtitan 0.2.2 prints its figures only as a log line through the root logger (MetricsProcessor.log);
its metric loggers (TensorBoard, W&B) are chosen inside the trainer. So this adds a filter to the root
logger, which torchtitan's init_logger leaves in place (it clears handlers, not filters): each record
that run_files.TitanMetricLine reads as a metric line is published through llm_pipeline.jobs.prom_textfile,
then passed on unchanged. Rank 0 alone publishes: loss is already the global mean, tps is per device
(times the world size for the run's tokens/s), mfu a percent. torchtitan's line has no learning rate.
The trainer module then runs as ``__main__`` with the remaining arguments.
"""

from __future__ import annotations

import logging
import math
import os
import runpy
import sys
import time
from pathlib import Path

import tomllib

from llm_pipeline.jobs import prom_textfile
from llm_pipeline.run_files import TitanMetricLine


class PublishMetricLines(logging.Filter):
    """Publishes every torchtitan metric line it sees; lets every record through."""

    def __init__(self, *, run: str, max_steps: int, world_size: int) -> None:
        super().__init__()
        self.run, self.max_steps, self.world_size = run, max_steps, world_size
        self.last: tuple[int, float] | None = None  # (step, when) of the previous line: the ETA's pace

    def filter(self, record: logging.LogRecord) -> bool:
        line = TitanMetricLine.parse(record.getMessage())
        if line is not None:
            now = time.monotonic()
            eta = math.nan
            if self.last and line.step > self.last[0]:
                per_step = (now - self.last[1]) / (line.step - self.last[0])
                eta = max(0, self.max_steps - line.step) * per_step
            self.last = (line.step, now)
            metrics = {"loss": line.loss, "tokens_per_second": line.tps * self.world_size, "mfu": line.mfu / 100}
            prom_textfile.publish_event(
                metrics, step=line.step, max_steps=self.max_steps, eta_seconds=eta, run=self.run
            )
        return True


def job_file(arguments: list[str]) -> Path:
    for index, argument in enumerate(arguments):
        if argument.startswith("--job.config_file="):
            return Path(argument.split("=", 1)[1])
        if argument == "--job.config_file" and index + 1 < len(arguments):
            return Path(arguments[index + 1])
    raise SystemExit("error: live_metrics needs the trainer's --job.config_file")


def install(arguments: list[str], environ: dict[str, str] | None = None) -> PublishMetricLines | None:
    """The filter on the root logger for rank 0 of a node with a textfile folder; None elsewhere."""
    env = os.environ if environ is None else environ
    if env.get("RANK", "0") != "0" or not env.get(prom_textfile.FOLDER_ENV):
        return None
    path = job_file(arguments)
    steps = tomllib.loads(path.read_text()).get("training", {}).get("steps", 0)
    publisher = PublishMetricLines(
        run=path.resolve().parents[2].name,  # <run>/ladder/<rung>/job.toml
        max_steps=int(steps),
        world_size=int(env.get("WORLD_SIZE", "1")),
    )
    logging.getLogger().addFilter(publisher)
    return publisher


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m llm_pipeline.training.torchtitan.live_metrics MODULE [trainer arguments]")
    module, arguments = sys.argv[1], sys.argv[2:]
    install(arguments)
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
