"""`hpctl run ...`: a run's metrics and charts on the laptop, from the S3 outputs prefix.

The cluster's outputs folder is exported to s3://<bucket>/outputs/ (and a training job's run folder
is synced there), so a run's TensorBoard events, evaluation and reports can be brought down without
a session on the cluster. Only what the charts, compare and TensorBoard read is downloaded (never
checkpoints or models): tensorboard/, eval/, compare/, the ladder's and the sweep's reports and
charts, and the training and rung logs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from cluster_contract import OUTPUTS_FOLDER, s3_prefix
from hpctl.common.errors import HpctlError, aws_errors
from llm_pipeline.run_files import StepLog

OUTPUTS_PREFIX = s3_prefix(OUTPUTS_FOLDER)
WANTED = re.compile(r"^(tensorboard/.+|eval/.+|compare/.+|ladder/report\.(md|json|png)|sweep/scaling\.(md|json|png))$")


def wanted(relative: str) -> bool:
    """A run's file that charts and comparisons read: the figures above, and the training jobs' logs."""
    folder, _, name = relative.rpartition("/")
    log = StepLog.parse(name) if folder == "logs" else None
    return bool(WANTED.match(relative)) or (log is not None and (log.step == "train" or log.step.startswith("rung-")))


S3_URL = re.compile(r"^s3://(?P<bucket>[^/]+)/(?P<prefix>.*?)/?$")
TENSORBOARD_PIN = "tensorboard==2.20.0"  # payloads/requirements-cluster.txt


def s3_location(run: str, bucket: str | None) -> tuple[str, str]:
    """(bucket, prefix ending in /) of a run given as s3://bucket/prefix or as a run name under outputs/."""
    match = S3_URL.match(run)
    if match:
        return match["bucket"], match["prefix"] + "/"
    if bucket is None or "/" in run.strip("/"):
        raise HpctlError(f"{run}: not a local folder, an s3://bucket/prefix URL or a run name under outputs/")
    return bucket, f"{OUTPUTS_PREFIX}{run.strip('/')}/"


def download_run(s3, bucket: str, prefix: str, destination: Path) -> list[Path]:
    """Copy the run's metrics, evaluation and reports below ``prefix`` into ``destination``."""
    written = []
    with aws_errors(f"read s3://{bucket}/{prefix}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix) :]
                if not wanted(relative):
                    continue
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, item["Key"], str(target))
                written.append(target)
    if not written:
        raise HpctlError(
            f"s3://{bucket}/{prefix} holds no run metrics (tensorboard/, eval/, logs/train-*.log): check the run "
            "name (`hpctl logs steps` lists the runs) and that the outputs export has run"
        )
    print(f"downloaded {len(written)} file(s) from s3://{bucket}/{prefix} to {destination}")
    return written


def local_copies(runs: list[str], folder: Path, s3, bucket: str | None) -> list[Path]:
    """Each run as a local folder: an existing path as it is, an S3 run downloaded under ``folder``."""
    result = []
    for run in runs:
        if Path(run).exists():
            result.append(Path(run))
            continue
        run_bucket, prefix = s3_location(run, bucket)
        destination = folder / Path(prefix.rstrip("/")).name
        download_run(s3, run_bucket, prefix, destination)
        result.append(destination)
    return result


def compare_runs(run_folders: list[Path], output: Path, *, by: str, steps: int | None, tolerance: float, labels):
    """The payload's compare command on the local copies; returns its exit status."""
    try:
        from llm_pipeline import compare
    except ImportError as exc:  # the laptop lacks matplotlib or tensorboard
        raise HpctlError(
            f"compare needs matplotlib and tensorboard ({exc}): pip install -r requirements-rehearse.txt"
        ) from None
    args = [str(p) for p in run_folders] + ["--output", str(output), "--by", by, "--tolerance", str(tolerance)]
    args += ["--steps", str(steps)] if steps else []
    args += ["--labels", labels] if labels else []
    return compare.main(args)


def tensorboard_command(folder: Path, port: int) -> list[str]:
    return ["tensorboard", "--logdir", str(folder / "tensorboard"), "--port", str(port)]


def open_tensorboard(folder: Path, port: int, *, launch: bool) -> None:
    """Start TensorBoard on the downloaded events, or print how to."""
    charts = sorted(str(p) for p in folder.rglob("*.png"))
    if charts:
        print("charts:\n  " + "\n  ".join(charts))
    command = tensorboard_command(folder, port)
    if not (folder / "tensorboard").is_dir():
        print(f"{folder} has no tensorboard/ events (a torchtitan ladder logs to its job logs instead)")
        return
    if not launch or shutil.which("tensorboard") is None:
        hint = "" if launch is False else f"tensorboard is not installed here: pip install {TENSORBOARD_PIN}, then "
        print(f"{hint}run: {' '.join(command)}  (then open http://localhost:{port})")
        return
    print(f"starting: {' '.join(command)}  (open http://localhost:{port}; Ctrl-C stops it)")
    subprocess.run(command, check=False)
