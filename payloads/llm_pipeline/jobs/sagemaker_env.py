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
    HPL_OUTPUTS_DIR   <root>/checkpoints: the run folder <root>/checkpoints/<run> is the job's checkpoint
                      folder, which SageMaker syncs to s3://<bucket>/outputs/<run>/ and restores on a
                      (spot) restart, so train resumes and the outputs land where the cluster's would

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

CONTAINER_ROOT = "/opt/ml"
CHECKPOINTS_FOLDER = "checkpoints"  # under the container root; SageMaker's default checkpoint folder
SCRATCH_FOLDER = "scratch"  # under the container root, on the job's ML storage volume
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


class SageMakerEnvError(ValueError):
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


def pipeline_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The HPL_* values for this container (see the module docstring); the steps read nothing else."""
    root = container_root(env)
    scratch = root / SCRATCH_FOLDER
    channel = {name: env.get(f"SM_CHANNEL_{name.upper()}", "") for name in (MODELS_CHANNEL, DATASETS_CHANNEL)}
    return {
        "HPL_FSX_MOUNT_PATH": str(scratch),  # no shared file system: everything else is per container
        "HPL_MODELS_DIR": str(scratch / "models"),
        "HPL_DATASETS_DIR": channel[DATASETS_CHANNEL] or str(scratch / "datasets"),
        "HPL_OUTPUTS_DIR": str(root / CHECKPOINTS_FOLDER),
        "HPL_COMPILE_CACHE_DIR": str(scratch / "neuron-cache"),
        "HPL_SCRATCH_DIR": str(scratch),
        "HPL_DEVICES_PER_NODE": str(devices_per_node(env)),
        "HPL_RUNTIME": "host",  # the job already runs inside the training image
    }


def link_model_channel(env: Mapping[str, str]) -> Path | None:
    """Show the `models` channel (one model folder) as HPL_MODELS_DIR/<HPL_MODEL_FOLDER>."""
    channel, folder = env.get(f"SM_CHANNEL_{MODELS_CHANNEL.upper()}", ""), env.get(MODEL_FOLDER_VARIABLE, "")
    if not channel or not folder:
        return None
    link = Path(pipeline_environment(env)["HPL_MODELS_DIR"]) / folder
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
    cache = Path(pipeline_environment(env)["HPL_COMPILE_CACHE_DIR"])
    shutil.copytree(channel, cache, dirs_exist_ok=True)
    return sum(1 for path in channel.rglob("*") if path.is_file())


def job_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment with the pipeline's HPL_* values laid over it."""
    base = dict(os.environ if env is None else env)
    return {**base, **pipeline_environment(base)}
