"""The run's own figures as Prometheus series, through node exporter's textfile collector (stdlib only; the
file's format is run_files.MetricsTextfile).

Each log event replaces ``$HPL_METRICS_TEXTFILE_PATH/hpl_run_<slurm job id>.prom`` (the folder the lifecycle
creates where observability = prometheus; unset or missing: nothing is written). The file is written
beside its final name and renamed, so node exporter never reads half a file; it reads only ``*.prom``.
Every series carries the run and the Slurm job id, so a dashboard puts a job's loss next to the
utilisation of the devices it ran on (DCGM's hpc_job label holds the same id). The file goes when the job
leaves the node (Slurm's epilog and the node's sweep, lifecycle/slurm_metrics.py), so the run's series end with it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from llm_pipeline.run_files import (
    REWARD_FUNCTION_KEY,
    REWARD_FUNCTION_SERIES,
    RUN_SERIES,
    RUN_SERIES_BY_KEY,
    MetricSample,
    MetricsTextfile,
)

PUBLISHER_KEYS = ("step", "max_steps", "eta_seconds", "timestamp")  # publish_event's own figures, not the log's

FOLDER_ENV = "HPL_METRICS_TEXTFILE_PATH"


def run_textfile_name(job_id: str) -> str:
    """The run's file in the textfile folder; lifecycle/slurm_metrics.py removes it by this name."""
    return f"hpl_run_{job_id}.prom"


def render(figures: Mapping[str, float], *, run: str, job_id: str) -> str:
    labels = (("run", run), ("slurm_job_id", job_id))
    samples = [MetricSample(s.name, labels, figures[s.key], s.help) for s in RUN_SERIES if s.key in figures]
    for key, value in figures.items():
        found = REWARD_FUNCTION_KEY.fullmatch(key)
        if found:
            function = REWARD_FUNCTION_SERIES
            samples.append(
                MetricSample(function.name, (*labels, ("function", found["function"])), value, function.help)
            )
    return MetricsTextfile(tuple(samples)).format()


def publish(figures: Mapping[str, float], *, run: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Write ``figures`` (keys of run_files.RUN_SERIES) for node exporter; the file, or None without a folder."""
    env = os.environ if environ is None else environ
    folder = env.get(FOLDER_ENV, "")
    if not folder or not os.path.isdir(folder):
        return None
    job_id = env.get("SLURM_JOB_ID", "none")
    target = Path(folder) / run_textfile_name(job_id)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".hpl_run_", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(render(figures, run=run, job_id=job_id))
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def publish_event(
    metrics: Mapping[str, float], *, step: int, max_steps: int, eta_seconds: float, run: str
) -> Path | None:
    """One log event of the engines' metrics logger; a failed write is a warning, never a failed run."""
    figures = {
        key: value
        for key, value in metrics.items()
        if (key in RUN_SERIES_BY_KEY and key not in PUBLISHER_KEYS) or REWARD_FUNCTION_KEY.fullmatch(key)
    }
    figures.update(step=step, max_steps=max_steps, eta_seconds=eta_seconds, timestamp=time.time())
    try:
        return publish(figures, run=run)
    except OSError as error:
        print(f"warning: the run's metrics were not written for node exporter: {error}", flush=True)
        return None
