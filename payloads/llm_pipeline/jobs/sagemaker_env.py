"""A SageMaker training container's facts, read as the HPL_* values the steps already use on Slurm.

A training job has no FSx and no cluster-facts file: SageMaker describes the job to the container
with environment variables (SM_HOSTS, SM_CURRENT_HOST, SM_CHANNEL_<NAME>, SM_MODEL_DIR,
SM_OUTPUT_DATA_DIR, written by the SDK's container driver) and with
<root>/input/config/resourceconfig.json, which SageMaker itself always writes. This module turns
them into the same HPL_* folders the run config's ``${HPL_..._DIR}`` paths expand on the cluster,
so every step runs unchanged (one code path, no SageMaker branch in the steps):

    HPL_MODELS_DIR    <root>/scratch/models; the `models` channel (s3://<bucket>/models/<model>/, one
                      model folder, keyed by its name so any run reuses it) appears there as
                      <model> (HPL_MODEL_FOLDER names it; link_model_channel); without the
                      channel the download step fetches the model from the Hub
    HPL_DATASETS_DIR  the `datasets` channel (s3://<bucket>/datasets/<run>/), else <root>/scratch/datasets
    HPL_OUTPUTS_DIR   on the first host <root>/checkpoints: the run folder <root>/checkpoints/<run> is
                      the job's checkpoint folder, which SageMaker syncs to s3://<bucket>/outputs/<run>/
                      and restores on a (spot) restart, so train resumes and the outputs land where
                      the cluster's would. On every other host <root>/scratch/outputs (not synced):
                      see "One copy in S3" below

One copy in S3. SageMaker syncs every host's checkpoint folder to the same S3 prefix and restores the
whole prefix to every host; its docs leave file names to the script ("to avoid overwrites in
distributed training with multiple instances, you must manually configure the checkpoint file names
and paths"). So the first host's run folder is the synced one, and each other host's run folder is
in scratch except two things: its ``checkpoints/`` is a link into the synced folder
(link_checkpoints), where it writes only its own ranks' files (``__<rank>_0.distcp``,
``rng_state_<rank>.pth``, its node's seal: names no other host writes), and its step logs
(``logs/<step>-<host>.log``, synced_path). On a restart every host gets every host's parts back in
``checkpoints/``. Within one job a host's disk holds only its own part; before train the hosts
agree on the checkpoint to resume from, and the first host sends the others its shared files
(trainer_state.json, scheduler.pt, the .metadata files), which each assembles with its own files
in scratch (resume_dir) and resumes from there, so they are not uploaded twice. The gather step
assembles the whole checkpoint for consolidate in scratch (gathered_dir), not in the synced folder,
so no file reaches S3 twice.

<root> is the container root (/opt/ml), taken as the parent of SM_MODEL_DIR so a rehearsal can lay
the same folders out anywhere. Stdlib only, Python 3.10 (hpctl imports the names below).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import PipelineError

CONTAINER_ROOT = "/opt/ml"
CHECKPOINTS_FOLDER = "checkpoints"  # under the container root; SageMaker's default checkpoint folder
SCRATCH_FOLDER = "scratch"  # under the container root, on the job's ML storage volume
MODELS_SCRATCH = "models"  # HPL_MODELS_DIR under the scratch folder
COMPILE_CACHE_SCRATCH = "neuron-cache"  # HPL_COMPILE_CACHE_DIR under the scratch folder
MODELS_CHANNEL = "models"
DATASETS_CHANNEL = "datasets"
# s3://<bucket>/neuron-cache/, shared by every job of the stack: restored into HPL_COMPILE_CACHE_DIR
# before precompile (restore_compile_cache), new entries written back after it (llm_pipeline.compile_cache).
# An underscore, not a hyphen: the SDK's driver names SM_CHANNEL_<NAME> after it.
COMPILE_CACHE_CHANNEL = "neuron_cache"
COMPILE_CACHE_URI_VARIABLE = "HPL_COMPILE_CACHE_URI"  # set by hpctl for Neuron types: where the cache persists
CHANNELS_FOLDER = "input/data"  # under the container root: SageMaker puts each channel in <channel>/
RESOURCE_CONFIG = "input/config/resourceconfig.json"  # under the container root
MODEL_FOLDER_VARIABLE = "HPL_MODEL_FOLDER"  # set by hpctl when the models channel holds that folder
DEFAULT_MASTER_PORT = 7777  # the port the SDK's container driver names (SM_MASTER_PORT)


class SageMakerEnvError(PipelineError, ValueError):
    """The container does not describe a training job; the message names the variable or file."""


@dataclass(frozen=True)
class JobHosts:
    """The job's hosts (algo-1, algo-2, ...) in SageMaker's order, and the one this container is."""

    hosts: tuple[str, ...]
    current: str
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def rank(self) -> int:
        return self.hosts.index(self.current)

    @property
    def leader(self) -> str:
        return self.hosts[0]

    @property
    def is_leader(self) -> bool:
        return self.current == self.leader


def container_root(env: Mapping[str, str]) -> Path:
    model_dir = env.get("SM_MODEL_DIR", "")
    return Path(model_dir).parent if model_dir else Path(CONTAINER_ROOT)


def in_training_job(env: Mapping[str, str]) -> bool:
    """True inside a SageMaker training container (or a rehearsal of one)."""
    return bool(env.get("SM_HOSTS") or env.get("SM_CURRENT_HOST") or env.get("TRAINING_JOB_NAME"))


def _resource_config(env: Mapping[str, str]) -> dict:
    path = container_root(env) / RESOURCE_CONFIG
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SageMakerEnvError(
            f"SM_HOSTS / SM_CURRENT_HOST are not set and {path} does not exist: run inside a SageMaker training job"
        ) from None
    except json.JSONDecodeError as exc:
        raise SageMakerEnvError(f"{path} is not valid JSON: {exc}") from None


def read_hosts(env: Mapping[str, str]) -> JobHosts:
    """SM_HOSTS (a JSON list) and SM_CURRENT_HOST, else resourceconfig.json's hosts/current_host."""
    if env.get("SM_HOSTS") and env.get("SM_CURRENT_HOST"):
        try:
            hosts = json.loads(env["SM_HOSTS"])
        except json.JSONDecodeError:
            raise SageMakerEnvError(f"SM_HOSTS={env['SM_HOSTS']!r} is not a JSON list of host names") from None
        current = env["SM_CURRENT_HOST"]
        where = "SM_HOSTS"
    else:
        config = _resource_config(env)
        hosts, current = config.get("hosts"), config.get("current_host", "")
        where = str(container_root(env) / RESOURCE_CONFIG)
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise SageMakerEnvError(f"{where}: expected a non-empty list of host names, got {hosts!r}")
    ordered = tuple(sorted(hosts))  # the SDK's driver ranks hosts in sorted order; so do we
    if current not in ordered:
        raise SageMakerEnvError(f"current host {current!r} is not one of the job's hosts {list(ordered)} ({where})")
    port_text = env.get("SM_MASTER_PORT", "") or str(DEFAULT_MASTER_PORT)
    if not port_text.isdigit():
        raise SageMakerEnvError(f"SM_MASTER_PORT={port_text!r} is not a port number")
    return JobHosts(hosts=ordered, current=current, master_port=int(port_text))


def devices_per_node(env: Mapping[str, str]) -> int:
    """HPL_DEVICES_PER_NODE when the job sets it, else the devices the container driver counted."""
    for name in ("HPL_DEVICES_PER_NODE", "SM_NUM_NEURONS", "SM_NUM_GPUS"):
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def scratch_dir(env: Mapping[str, str]) -> Path:
    return container_root(env) / SCRATCH_FOLDER


def synced_outputs_dir(env: Mapping[str, str]) -> Path:
    """Where run folders sit in the checkpoint folder SageMaker syncs (CheckpointConfig.LocalPath is
    <this>/<run>); the first host's HPL_OUTPUTS_DIR."""
    return container_root(env) / CHECKPOINTS_FOLDER


def outputs_dir(env: Mapping[str, str]) -> Path:
    """This host's HPL_OUTPUTS_DIR: the synced folder on the first host, scratch on the others."""
    if read_hosts(env).is_leader:
        return synced_outputs_dir(env)
    return scratch_dir(env) / "outputs"


def synced_path(env: Mapping[str, str], path: Path) -> Path:
    """``path`` (under this host's HPL_OUTPUTS_DIR) at the same place in the synced folder."""
    return synced_outputs_dir(env) / Path(path).relative_to(outputs_dir(env))


def link_checkpoints(env: Mapping[str, str], checkpoints_dir: Path) -> Path | None:
    """On a host other than the first, make the run's ``checkpoints/`` a link to the same folder in the
    synced checkpoint folder, so its ranks' checkpoint files reach S3 (and come back on a restart).
    Returns the linked folder, None on the first host (its run folder is the synced one)."""
    target = synced_path(env, checkpoints_dir)
    if target == Path(checkpoints_dir):
        return None
    target.mkdir(parents=True, exist_ok=True)
    link = Path(checkpoints_dir)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)
    return target


def gathered_dir(env: Mapping[str, str], output_dir: Path) -> Path:
    """Where the gather step assembles a run folder's whole checkpoint on the first host: scratch,
    outside the synced folder (each part is already in S3, uploaded by the host that wrote it)."""
    return _scratch_copy(env, output_dir, "gathered")


def resume_dir(env: Mapping[str, str], output_dir: Path) -> Path:
    """Where a host other than the first assembles the checkpoint its train resumes from (its own files
    and the first host's shared ones, gather.agree_on_resume): scratch, so none is uploaded again."""
    return _scratch_copy(env, output_dir, "resume")


def _scratch_copy(env: Mapping[str, str], output_dir: Path, purpose: str) -> Path:
    return scratch_dir(env) / purpose / Path(output_dir).relative_to(outputs_dir(env))


def pipeline_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The HPL_* values for this container (see the module docstring); the steps read nothing else."""
    scratch = scratch_dir(env)
    channel = {name: env.get(f"SM_CHANNEL_{name.upper()}", "") for name in (MODELS_CHANNEL, DATASETS_CHANNEL)}
    return {
        "HPL_FSX_MOUNT_PATH": str(scratch),  # no shared file system: everything else is per container
        "HPL_MODELS_DIR": str(scratch / MODELS_SCRATCH),
        "HPL_DATASETS_DIR": channel[DATASETS_CHANNEL] or str(scratch / "datasets"),
        "HPL_OUTPUTS_DIR": str(outputs_dir(env)),
        "HPL_COMPILE_CACHE_DIR": str(scratch / COMPILE_CACHE_SCRATCH),
        "HPL_SCRATCH_DIR": str(scratch),
        "HPL_DEVICES_PER_NODE": str(devices_per_node(env)),
        "HPL_RUNTIME": "host",  # the job already runs inside the training image
    }


def link_model_channel(env: Mapping[str, str]) -> Path | None:
    """Show the `models` channel (one model folder) as HPL_MODELS_DIR/<HPL_MODEL_FOLDER>."""
    channel, folder = env.get(f"SM_CHANNEL_{MODELS_CHANNEL.upper()}", ""), env.get(MODEL_FOLDER_VARIABLE, "")
    if not channel or not folder:
        return None
    link = scratch_dir(env) / MODELS_SCRATCH / folder
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(channel, target_is_directory=True)
    return link


def restore_compile_cache(env: Mapping[str, str]) -> int:
    """Copy the `neuron_cache` channel (the stack's compile cache from earlier jobs) into
    HPL_COMPILE_CACHE_DIR, where neuronx-cc looks (--cache_dir); the channel folder stays as it came.
    Returns how many files came; 0 without the channel (a first job, or a type without Neuron)."""
    channel = Path(
        env.get(f"SM_CHANNEL_{COMPILE_CACHE_CHANNEL.upper()}", "")
        or container_root(env) / CHANNELS_FOLDER / COMPILE_CACHE_CHANNEL
    )
    if not channel.is_dir():
        return 0
    cache = scratch_dir(env) / COMPILE_CACHE_SCRATCH
    shutil.copytree(channel, cache, dirs_exist_ok=True)
    return sum(1 for path in channel.rglob("*") if path.is_file())


def job_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment with the pipeline's HPL_* values laid over it."""
    base = dict(os.environ if env is None else env)
    return {**base, **pipeline_environment(base)}
