"""`hpctl submit`: run the pipeline's submit command on the controller and collect the job ids.

Run configs reach the cluster only through a deploy (payloads/ -> S3 -> FSx), so the config must
be a file under payloads/configs/ here, and its deployed copy must match it. `--dry-run` needs no
AWS at all: it validates the config here and prints the chain the controller would submit.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

import llm_pipeline
from cluster_contract import FSX_FOLDER_FACTS, PAYLOADS_FOLDER, fsx_dir
from hpctl.errors import HpctlError, aws_errors
from llm_pipeline.config import ConfigError, load

CONFIGS_DIR = Path(PAYLOADS_FOLDER) / "configs"
JOB_LINE = re.compile(r"^submitted (?P<step>\S+) job (?P<job_id>\d+)\b")
PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./-]*")
EXIT_MARKER = "hpctl-remote-exit="
EXIT_LINE = re.compile(re.escape(EXIT_MARKER) + r"(?P<status>\d+)$")
# What every node exports for the shared folders (HPL_<KEY>): a run config reads here as it reads there.
CLUSTER_FOLDERS_ENV = {f"HPL_{key.upper()}": fsx_dir(folder) for key, folder in FSX_FOLDER_FACTS.items()}


@dataclass(frozen=True)
class SubmitOptions:
    config: str  # path relative to payloads/, e.g. configs/default.toml
    from_step: str | None = None
    dry_run: bool = False
    smoke: bool = True  # False: submit --no-smoke (no smoke stage, no estimate)


def resolve_run_config(value: str, *, project_root: Path) -> Path:
    """The local run config file for ``value``: a name, configs/<file> or a path under payloads/configs."""
    configs = (project_root / CONFIGS_DIR).resolve()
    candidates = (
        [Path(value)]
        if Path(value).is_absolute()
        else [
            project_root / value,
            project_root / PAYLOADS_FOLDER / value,
            configs / value,
            configs / f"{value}.toml",
        ]
    )
    for candidate in candidates:
        if candidate.is_file():
            path = candidate.resolve()
            if path.parent != configs:
                raise HpctlError(
                    f"run config {value} is not in {CONFIGS_DIR}/: only that folder reaches the cluster; "
                    f"copy it there and deploy (`make deploy`)"
                )
            return path
    available = ", ".join(sorted(path.name for path in configs.glob("*.toml"))) or "none"
    raise HpctlError(f"run config {value} not found in {CONFIGS_DIR}/ (available: {available})")


def validate_run_config(path: Path) -> None:
    """Read the run config as every step will (the cluster's folders), so a bad key stops here."""
    try:
        import tomllib  # noqa: F401  (Python 3.11+; llm_pipeline.config.load needs it)
    except ModuleNotFoundError:
        print("note: Python 3.10 cannot read TOML: the run config is validated on the cluster", file=sys.stderr)
        return
    try:
        load(path, env={**os.environ, **CLUSTER_FOLDERS_ENV})
    except ConfigError as error:
        raise HpctlError(f"run config {path}: {error}") from error


def chain_argv(options: SubmitOptions) -> list[str]:
    """The submit step's arguments after the interpreter: the same here (dry run) and on the controller."""
    argv = ["-m", "llm_pipeline.submit", "--config", options.config]
    if options.from_step:
        argv += ["--from", options.from_step]
    if not options.smoke:
        argv.append("--no-smoke")
    if options.dry_run:
        argv.append("--dry-run")
    return argv


def offline_dry_run(options: SubmitOptions, *, project_root: Path) -> None:
    """Print the chain with this checkout's submit step, in the payloads folder, with the cluster's folders."""
    payloads = project_root / PAYLOADS_FOLDER
    print(
        "# offline: this checkout's submit step; the deployed partitions and images are not read, "
        "so a deploy with several partitions may pick another one",
        flush=True,
    )
    # This checkout's package first; the one hpctl runs with when the folder holds none.
    installed = str(Path(llm_pipeline.__file__).resolve().parents[1])
    python_path = os.pathsep.join((str(payloads), str(project_root), installed))
    env = {**os.environ, **CLUSTER_FOLDERS_ENV, "PYTHONPATH": python_path}
    result = subprocess.run([sys.executable, *chain_argv(options)], cwd=payloads, env=env, check=False)
    if result.returncode != 0:
        raise HpctlError(f"the chain's dry run failed (exit {result.returncode}): see its output above")


def check_deployed_copy(session: boto3.Session, *, bucket: str, local: Path) -> None:
    """The controller reads the deployed copy; refuse to submit when it differs from the local file."""
    key = f"{CONFIGS_DIR.as_posix()}/{local.name}"
    with aws_errors(f"read s3://{bucket}/{key}"):
        try:
            deployed = session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            raise HpctlError(
                f"{CONFIGS_DIR / local.name} is not deployed yet (no s3://{bucket}/{key}): run `make deploy` first"
            ) from error
    if deployed != local.read_bytes():
        raise HpctlError(
            f"{CONFIGS_DIR / local.name} differs from its deployed copy s3://{bucket}/{key}: "
            "run `make deploy` so the cluster sees your edits"
        )


def remote_command(options: SubmitOptions, *, facts: dict) -> str:
    """One command line for the node: the submit step as the default user in a login shell."""
    payloads_dir = facts["payloads_dir"]
    if not PLAIN_PATH.fullmatch(payloads_dir):  # it sits inside "${...:-default}", where quoting would not apply
        raise HpctlError(f"cluster facts: payloads_dir {payloads_dir!r} is not a plain absolute path")
    submit = ["python3", *chain_argv(options)]
    # HPL_PAYLOADS_DIR comes from /etc/profile.d on the node; the facts file gives the same value.
    script = f'cd "${{HPL_PAYLOADS_DIR:-{payloads_dir}}}" && {shlex.join(submit)}; echo "{EXIT_MARKER}$?"'
    return shlex.join(["sudo", "-n", "-u", facts["default_user"], "-H", "bash", "-lc", script])


class SubmitOutput:
    """Collects what the remote submit prints: job ids and its exit status; echoes the rest."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []
        self.exit_status: int | None = None

    def __call__(self, line: str) -> None:
        marker = EXIT_LINE.search(line)
        if marker:  # output without a final newline shares the marker's line
            self.exit_status = int(marker["status"])
            line = line[: marker.start()]
            if not line:
                return
        print(line, flush=True)
        match = JOB_LINE.match(line.strip())
        if match:
            self.jobs.append((match["step"], match["job_id"]))

    def verdict(self, *, session_rc: int, dry_run: bool) -> list[tuple[str, str]]:
        """The submitted jobs, or an HpctlError saying how the submission went wrong."""
        if self.exit_status is None:
            raise HpctlError(
                f"the session ended before the submit command finished (aws exit {session_rc}): see the output above"
            )
        if self.exit_status != 0:
            raise HpctlError(
                f"the submit command failed on the controller (exit {self.exit_status}): see its output above"
            )
        if not self.jobs and not dry_run:
            raise HpctlError("the submit command printed no job ids: see its output above")
        return self.jobs


def print_jobs(jobs: list[tuple[str, str]]) -> None:
    if not jobs:
        return
    width = max(len(step) for step, _ in jobs)
    print("\nsubmitted jobs:")
    for step, job_id in jobs:
        print(f"  {step:<{width}}  {job_id}")
    print("follow them with `hpctl shell` then `squeue`, or `hpctl logs steps`")
