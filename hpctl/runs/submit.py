"""`hpctl submit`: send a run config to the cluster and run the submit step on the controller.

The config is validated here, uploaded to s3://<bucket>/payloads/run-configs/ (FSx imports it into
the payloads folder within seconds) and submitted from there: no deploy, no CloudFormation change.
A data.dataset that is a file on this machine goes with it (hpctl/common/run_data.py). The payload code still
ships only with a deploy; submit says when the deployed code differs from this checkout's. `--dry-run`
needs no AWS at all: it validates the config and prints the chain as the cluster would run it: a table
of its jobs on the partition cdk.json's compute groups give the run (hpctl/submit_plan.py), then the
sbatch lines with the cluster's paths.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

import llm_pipeline
from cluster_contract import (
    PAYLOAD_CODE_DIGEST_FILE,
    PAYLOADS_FOLDER,
    RUN_CONFIGS_FOLDER,
    cluster_folders_env,
    fsx_dir,
    payload_code_digest,
)
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.project import read_cdk_context
from hpctl.common.run_data import LocalDataset, cluster_dataset_key, local_dataset
from hpctl.common.ssm import EXIT_MARKER, MarkedOutput
from hpctl.runs.submit_plan import partition_plan
from lifecycle.slurm_teams import user_outputs_dir
from llm_pipeline.config import ConfigError, load
from llm_pipeline.jobs.accounts import DESCRIPTION_OPENING
from llm_pipeline.jobs.chain import DRY_RUN_OPENING, DRY_RUN_SCRIPT_OPENING
from llm_pipeline.jobs.run_config_text import with_keys
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.run_files import SubmittedLine

CONFIGS_DIR = Path(PAYLOADS_FOLDER) / "configs"
PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./-]*")
IMPORT_WAIT_S = 120  # FSx auto-import usually shows a new object within seconds
IMPORT_POLL_S = 2
# What every node exports for the shared folders (HPL_<KEY>): a run config reads here as it reads there.
CLUSTER_FOLDERS_ENV = cluster_folders_env()


@dataclass(frozen=True)
class SubmitOptions:
    config: str  # path relative to the payloads folder, e.g. run-configs/default-0123456789ab.toml
    from_step: str | None = None
    to_step: str | None = None  # submit --to: the chain stops after this step
    dry_run: bool = False
    smoke: bool = True  # False: submit --no-smoke (no smoke stage, no estimate)
    replace_outputs: bool = False  # submit --replace-outputs: an earlier training's outputs move aside
    ladder: bool = False  # the torchtitan ladder (llm_pipeline.submit ladder)
    sweep_nodes: str | None = None  # the scaling sweep at these node counts (llm_pipeline.sweep --nodes)
    account: str = ""  # submit --account: the Slurm account (default: the user's team's; docs/teams.md)
    user: str = ""  # the cluster user who submits (a cdk.json user); default: the cluster's default user


@dataclass(frozen=True)
class RunConfigToSend:
    """The run config as the cluster gets it: its bytes (data.dataset pointed at the upload), and the data file
    that goes with it or the bucket key it reads."""

    local: Path
    body: bytes
    dataset: LocalDataset | None = None
    dataset_key: str | None = None  # a data.dataset already under the cluster's datasets folder


@dataclass(frozen=True)
class SentConfig:
    key: str  # s3 key under the bucket
    path: str  # the same file relative to the payloads folder on FSx
    digest: str  # sha256 of its bytes: the controller waits until FSx shows exactly these


def resolve_run_config(value: str, *, project_root: Path) -> Path:
    """The local run config file for ``value``: a path, or a name / configs/<file> in payloads/configs/."""
    configs = (project_root / CONFIGS_DIR).resolve()
    candidates = (
        [Path(value)]
        if Path(value).is_absolute()
        else [
            Path.cwd() / value,
            project_root / value,
            project_root / PAYLOADS_FOLDER / value,
            configs / value,
            configs / f"{value}.toml",
        ]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    available = ", ".join(sorted(path.name for path in configs.glob("*.toml"))) or "none"
    raise HpctlError(f"run config {value} not found (a path, or a name in {CONFIGS_DIR}/: {available})")


def validate_run_config(path: Path) -> RunConfigToSend:
    """Read the run config as every step will (the cluster's folders), so a bad key stops here (any Python
    from 3.10: config.load reads with tomli's shipped wheel where there is no tomllib); what to send."""
    try:
        cfg = load(path, env={**os.environ, **CLUSTER_FOLDERS_ENV})
    except ConfigError as error:
        raise HpctlError(f"run config {path}: {error}") from error
    dataset = local_dataset(cfg.data.dataset, run=Path(cfg.paths.output_dir).name)
    if dataset is None:
        return RunConfigToSend(local=path, body=path.read_bytes(), dataset_key=cluster_dataset_key(cfg.data.dataset))
    body = with_keys(path.read_text(), {("data", "dataset"): dataset.config_value}).encode()
    return RunConfigToSend(local=path, body=body, dataset=dataset)


def sent_config(local: Path, body: bytes) -> SentConfig:
    """Where ``body`` goes: a name that carries its digest, so an edit never overwrites what a chain reads."""
    digest = hashlib.sha256(body).hexdigest()
    path = f"{RUN_CONFIGS_FOLDER}/{local.stem}-{digest[:12]}.toml"
    return SentConfig(key=f"{PAYLOADS_FOLDER}/{path}", path=path, digest=digest)


def chain_argv(options: SubmitOptions) -> list[str]:
    """The submit step's arguments after the interpreter: the same here (dry run) and on the controller."""
    if options.sweep_nodes:
        argv = ["-m", "llm_pipeline.sweep", "--config", options.config, "--nodes", options.sweep_nodes]
    else:
        argv = ["-m", "llm_pipeline.submit", *(["ladder"] if options.ladder else []), "--config", options.config]
    if options.from_step:
        argv += ["--from", options.from_step]
    if options.to_step:
        argv += ["--to", options.to_step]
    if not options.smoke:
        argv.append("--no-smoke")
    if options.replace_outputs:
        argv.append("--replace-outputs")
    if options.dry_run:
        argv.append("--dry-run")
    if options.account:
        argv += ["--account", options.account]
    return argv


ACCOUNT_NOTE = f"# {DESCRIPTION_OPENING}"  # the chain's dry run says so on stderr (llm_pipeline.submit)


def split_plan_table(text: str) -> tuple[str, str, str]:
    """The chain's dry-run output as (its table: the "nothing submitted" line and where each job runs; what the
    chain printed before it; the rest, the script from its opening line or its first command)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(DRY_RUN_OPENING)), len(lines))
    end = start
    while end < len(lines) and lines[end].startswith("#") and not lines[end].startswith(DRY_RUN_SCRIPT_OPENING):
        end += 1
    return "".join(lines[start:end]), "".join(lines[:start]), "".join(lines[end:])


def offline_dry_run(options: SubmitOptions, *, project_root: Path, to_send: RunConfigToSend | None = None) -> None:
    """Print the chain with this checkout's submit step, in the payloads folder, with the cluster's folders and
    the partition cdk.json gives the run; this machine's paths in it are shown as the cluster's."""
    payloads = project_root / PAYLOADS_FOLDER
    local = Path(options.config)
    to_send = to_send or RunConfigToSend(local=local, body=local.read_bytes())
    # The chain's own table of where each job runs opens the output; these notes follow it.
    notes = [
        "# offline: this checkout's submit step, with the partitions of cdk.json's compute_groups (a deploy "
        "of other groups may pick another one)"
    ]
    context = read_cdk_context(project_root) if (project_root / "cdk.json").is_file() else {}
    folders = dict(CLUSTER_FOLDERS_ENV)
    if options.user:  # the profile points a team user's runs at their own outputs folder (docs/teams.md)
        folders["HPL_OUTPUTS_DIR"] = user_outputs_dir(folders["HPL_OUTPUTS_DIR"], options.user)
        notes.append(f"# as {options.user}: ${{HPL_OUTPUTS_DIR}} is {folders['HPL_OUTPUTS_DIR']} (their own)")
    plan = partition_plan(context, read_run_facts(local, {**os.environ, **folders}))
    notes += plan.lines
    cluster_config = f"{fsx_dir(PAYLOADS_FOLDER)}/{sent_config(local, to_send.body).path}"
    notes.append(f"# run config {local} -> {cluster_config} (sent at submit)")
    if to_send.dataset:
        notes.append(
            f"# data.dataset {to_send.dataset.local} -> s3://<bucket>/{to_send.dataset.key} (uploaded at submit), "
            f"read on the cluster as {to_send.dataset.cluster_path}"
        )
    # This checkout's package first; the one hpctl runs with when the folder holds none.
    installed = str(Path(llm_pipeline.__file__).resolve().parents[1])
    python_path = os.pathsep.join((str(payloads), str(project_root), installed))
    env = {**os.environ, **folders, **plan.env, "PYTHONPATH": python_path}
    with tempfile.TemporaryDirectory(prefix="hpctl-dry-run-") as scratch:
        if options.sweep_nodes:  # the sweep's dry run writes its point configs into the run folder
            env["HPL_OUTPUTS_DIR"] = scratch
            notes.append(f"# the sweep's run folders are under a scratch folder standing in for {fsx_dir('outputs')}")
        command = [sys.executable, *chain_argv(options)]
        result = subprocess.run(command, cwd=payloads, env=env, check=False, capture_output=True, text=True)
    # This machine's paths as the cluster names them: the config as sent, the payloads (the package the chain
    # ran from: this checkout's, else the installed one) on FSx.
    ran_from = payloads if (payloads / "llm_pipeline").is_dir() else Path(installed)
    laptop = ((str(local.resolve()), cluster_config), (str(ran_from.resolve()), fsx_dir(PAYLOADS_FOLDER)))
    text = result.stdout
    for here, there in laptop:
        text = text.replace(here, there)
    table, before, rest = split_plan_table(text)
    if plan.warning:  # first: the table below is drawn on a partition the run does not want
        print(plan.warning, file=sys.stderr, flush=True)
    print(table, end="", flush=True)
    print("\n".join(notes), flush=True)
    # The chain's notes and errors, less its account: the one it found is this machine's Slurm user's.
    chain_notes = [line for line in result.stderr.splitlines(keepends=True) if not line.startswith(ACCOUNT_NOTE)]
    print("".join(chain_notes), end="", file=sys.stderr, flush=True)
    print(f"{ACCOUNT_NOTE}the submitting cluster user's team account, looked up on the cluster at submit", flush=True)
    print(before + rest, end="", flush=True)
    if result.returncode != 0:
        raise HpctlError(f"the chain's dry run failed (exit {result.returncode}): see its output above")


def send_run_config(session: boto3.Session, *, bucket: str, local: Path, body: bytes | None = None) -> SentConfig:
    """Upload the config (``body``, default the file's bytes) under a name that carries its digest."""
    body = local.read_bytes() if body is None else body
    sent = sent_config(local, body)
    with aws_errors(f"upload the run config to s3://{bucket}/{sent.key}"):
        session.client("s3").put_object(Bucket=bucket, Key=sent.key, Body=body)
    print(f"run config {local} -> s3://{bucket}/{sent.key}", file=sys.stderr, flush=True)
    return sent


def note_payload_code_age(session: boto3.Session, *, bucket: str, project_root: Path) -> None:
    """Say so when the payload code the cluster runs is not this checkout's (only a deploy ships code)."""
    payloads = project_root / PAYLOADS_FOLDER
    if not (payloads / "llm_pipeline").is_dir():
        return  # hpctl runs outside a checkout: nothing to compare
    key = f"{PAYLOADS_FOLDER}/{PAYLOAD_CODE_DIGEST_FILE}"
    with aws_errors(f"read s3://{bucket}/{key}"):
        try:
            deployed = session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode().strip()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            deployed = ""
    if not deployed:
        print(
            f"note: the deploy records no payload code digest (no s3://{bucket}/{key}): `make deploy` "
            "ships this checkout's code and records one",
            file=sys.stderr,
        )
    elif deployed != payload_code_digest(payloads):
        print(
            "note: the payload code on FSx differs from this checkout's payloads/ (llm_pipeline, slurm): "
            "the run uses the deployed code; `make deploy` ships yours",
            file=sys.stderr,
        )


def remote_command(options: SubmitOptions, *, facts: dict, sent: SentConfig | None = None) -> str:
    """One command line for the node: the submit step as the default user in a login shell, after FSx has
    imported the sent config (auto-import takes seconds; the loop gives it IMPORT_WAIT_S)."""
    payloads_dir = facts["payloads_dir"]
    if not PLAIN_PATH.fullmatch(payloads_dir):  # it sits inside "${...:-default}", where quoting would not apply
        raise HpctlError(f"cluster facts: payloads_dir {payloads_dir!r} is not a plain absolute path")
    submit = shlex.join(["python3", *chain_argv(options)])
    if sent is not None:
        imported = f'[ "$(sha256sum < {shlex.quote(sent.path)} 2>/dev/null | cut -c1-64)" = {sent.digest} ]'
        tries = IMPORT_WAIT_S // IMPORT_POLL_S
        wait = (
            f"{{ for _ in $(seq {tries}); do {imported} && break; sleep {IMPORT_POLL_S}; done; {imported} || "
            f'{{ echo "error: {sent.path} has not reached FSx after {IMPORT_WAIT_S} s (auto-import from '
            f's3://.../{sent.key}): check the data repository association of {PAYLOADS_FOLDER}/"; false; }}; }}'
        )
        submit = f"{wait} && {submit}"
    # HPL_PAYLOADS_DIR comes from /etc/profile.d on the node; the facts file gives the same value.
    script = f'cd "${{HPL_PAYLOADS_DIR:-{payloads_dir}}}" && {submit}; echo "{EXIT_MARKER}$?"'
    return shlex.join(["sudo", "-n", "-u", options.user or facts["default_user"], "-H", "bash", "-lc", script])


class SubmitOutput(MarkedOutput):
    """Collects what the remote submit prints: job ids and its exit status; echoes the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[tuple[str, str]] = []

    def read(self, line: str) -> None:
        submitted = SubmittedLine.parse(line)
        if submitted:
            self.jobs.append((submitted.step, submitted.job))

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
