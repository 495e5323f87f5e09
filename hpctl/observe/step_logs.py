"""`hpctl logs steps`: pipeline step logs, exported from /fsx/outputs/<run>/logs to S3.

The outputs folder is linked to s3://<bucket>/outputs/ (import and export), so every run's
Slurm logs can be read from a laptop without a session on the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import boto3

from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.run_progress import OUTPUTS_PREFIX, check_run, list_runs
from hpctl.common.table import format_table


@dataclass(frozen=True)
class LogFile:
    key: str
    name: str  # path below <run>/logs/
    size: int
    modified: datetime


def list_log_files(s3, bucket: str, run: str) -> list[LogFile]:
    prefix = f"{OUTPUTS_PREFIX}{run}/logs/"
    files: list[LogFile] = []
    with aws_errors(f"list s3://{bucket}/{prefix}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            files += [
                LogFile(
                    key=item["Key"], name=item["Key"][len(prefix) :], size=item["Size"], modified=item["LastModified"]
                )
                for item in page.get("Contents", [])
                if not item["Key"].endswith("/")
            ]
    return sorted(files, key=lambda item: (item.modified, item.name))


def choose_log(files: list[LogFile], wanted: str, *, run: str) -> LogFile:
    """The file named ``wanted``, else the newest whose name starts with it (a step name)."""
    for item in files:
        if item.name == wanted:
            return item
    matches = [item for item in files if item.name.startswith(wanted)]
    if not matches:
        names = ", ".join(item.name for item in files)
        raise HpctlError(f"no log {wanted!r} in run {run} (logs: {names})")
    return matches[-1]


def print_log(s3, bucket: str, item: LogFile, *, tail: int) -> None:
    with aws_errors(f"read s3://{bucket}/{item.key}"):
        text = s3.get_object(Bucket=bucket, Key=item.key)["Body"].read().decode("utf-8", errors="replace")
    lines = text.splitlines()
    print("\n".join(lines[-tail:] if tail else lines))


def show_step_logs(session: boto3.Session, bucket: str, *, run: str | None, log: str | None, tail: int) -> None:
    s3 = session.client("s3")
    runs = list_runs(s3, bucket)
    if run is None:
        if not runs:
            raise HpctlError(f"no runs in s3://{bucket}/{OUTPUTS_PREFIX} yet: submit one with `hpctl submit`")
        rows = []
        for name in runs:
            files = list_log_files(s3, bucket, name)
            rows.append([name, len(files), files[-1].modified.strftime("%Y-%m-%d %H:%M") if files else "-"])
        print(format_table(["RUN", "LOG FILES", "LATEST"], rows, indent=""))
        return
    check_run(run, runs, bucket)
    files = list_log_files(s3, bucket, run)
    if not files:
        raise HpctlError(f"run {run} has no logs in s3://{bucket}/{OUTPUTS_PREFIX}{run}/logs/ yet")
    if log is None:
        print(
            format_table(
                ["LOG", "BYTES", "MODIFIED"],
                [[item.name, item.size, item.modified.strftime("%Y-%m-%d %H:%M")] for item in files],
                indent="",
            )
        )
        return
    print_log(s3, bucket, choose_log(files, log, run=run), tail=tail)
