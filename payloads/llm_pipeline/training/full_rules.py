"""Full fine-tuning sizes, from the model's config.json alone (stdlib: prepare runs it before the model loads).

- The trainable count the neuron trainer must report: optimum-neuron 0.4.5's get_model_param_count
  counts a tensor-parallel parameter as its local size x TP, so the KV heads it replicates
  (``kv_size_multiplier``, when TP does not divide the KV heads) count that many times.
- The size of one checkpoint. The neuron engine saves the model only (``save_only_model``: its
  resume consolidates the weights and never reads optimizer state): 2 bytes per parameter in bf16,
  ~16 GB for an 8B model. The torch engine's resume reads the optimizer, so its checkpoints add fp32
  master weights and AdamW's two moments (12 bytes per parameter; FSDP spreads them over the ranks
  but all of it is saved): about 14 bytes per parameter, ~112 GB for an 8B model.
- Whether the run folder's file system holds ``train.save_total_limit`` of them and the
  consolidated model; if not, what to change.
- The host memory a node needs while the model loads, and whether the node has it: the torch engine's
  full fine-tuning loads fp32 master weights; without efficient loading every rank of a node holds a whole
  copy (64 ranks x ~30 GiB for an 8B model on a trn2.48xlarge, about all of its 2,048 GiB), with it
  (accelerate's ``cpu_ram_efficient_loading``: rank 0 loads, the others allocate without reading and
  receive their shards) one copy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError

PROCESS_BYTES = 2 * 2**30  # one rank's Python, torch, transformers and runtime before the model (the estimate)
HOST_MEMORY_SHARE = 0.9  # of the node's memory a load may take: the rest is the OS, Slurm, page cache, data loaders
OPTIMIZER_BYTES_PER_PARAMETER = 12  # fp32 master copy + AdamW exp_avg + exp_avg_sq (ZeRO-1 shards them over DP)
FSX_SIZES = "1200 GiB or a multiple of 2400 GiB"  # FSx for Lustre PERSISTENT_2 SSD (stacks/config.py)


def parameter_count(model_config: Mapping[str, Any], kv_size_multiplier: int | None = None) -> int:
    """Parameters of a Llama-family model (KV projections counted ``kv_size_multiplier`` times)."""
    hidden = int(model_config["hidden_size"])
    layers = int(model_config["num_hidden_layers"])
    heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or heads)
    head_dim = int(model_config.get("head_dim") or hidden // heads)
    vocab, intermediate = int(model_config["vocab_size"]), int(model_config["intermediate_size"])
    kv = kv_heads * head_dim * (kv_size_multiplier or 1)
    per_layer = hidden * heads * head_dim * 2 + 2 * hidden * kv + 3 * hidden * intermediate + 2 * hidden
    head = 0 if model_config.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + head


def checkpoint_bytes(model_config: Mapping[str, Any], bf16: bool, *, with_optimizer: bool) -> int:
    """One full fine-tuning checkpoint: the weights, plus the optimizer state when it is saved."""
    params = parameter_count(model_config)
    return params * ((2 if bf16 else 4) + (OPTIMIZER_BYTES_PER_PARAMETER if with_optimizer else 0))


def _existing_folder(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _bytes_under(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def check_storage(cfg: RunConfig, model_config: Mapping[str, Any], *, backend: str) -> str:
    """Refuse a full fine-tuning run whose checkpoints cannot fit; returns the plan as one line."""
    with_optimizer = backend != "neuron"  # the neuron engine saves the model only (module docstring)
    checkpoint = checkpoint_bytes(model_config, cfg.train.bf16, with_optimizer=with_optimizer)
    model = parameter_count(model_config) * 2
    keep = cfg.train.save_total_limit
    needed = keep * checkpoint + model
    run_dir = Path(cfg.paths.output_dir)
    where = _existing_folder(run_dir)
    stats = os.statvfs(where)
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    reusable = _bytes_under(cfg.paths.checkpoints_dir) if cfg.paths.checkpoints_dir.is_dir() else 0
    held = "weights + optimizer state" if with_optimizer else "weights"
    plan = (
        f"{keep} checkpoint(s) of ~{checkpoint / 1e9:.0f} GB ({held}) and the "
        f"~{model / 1e9:.0f} GB model folder: ~{needed / 1e9:.0f} GB; {where} has {(free + reusable) / 1e9:.0f} GB "
        f"free of {total / 1e9:.0f} GB"
    )
    if needed <= free + reusable:
        return plan
    fits = max(0, (free + reusable - model) // checkpoint)
    advice = f"lower train.save_total_limit to {fits}" if fits >= 1 else "free space on it"
    raise StepError(
        f"train.save_total_limit: {plan}. {advice[0].upper() + advice[1:]}, or grow the file system (FSx: the "
        f"fsx_storage_capacity_gib context of the stack, {FSX_SIZES}) before training"
    )


def load_peak_bytes(model_config: Mapping[str, Any], *, ranks: int, load_bytes: int, loads_once: bool) -> int:
    """A node's host memory at load: every rank's process, and one model copy a loading rank."""
    copies = 1 if loads_once else ranks
    return ranks * PROCESS_BYTES + copies * parameter_count(model_config) * load_bytes


def check_host_memory(
    model_config: Mapping[str, Any], *, ranks: int, load_bytes: int, loads_once: bool, host_memory_gib: float
) -> str:
    """Refuse in one line a load the node's memory cannot hold; returns the plan as one line."""
    peak = load_peak_bytes(model_config, ranks=ranks, load_bytes=load_bytes, loads_once=loads_once)
    allowed = HOST_MEMORY_SHARE * host_memory_gib * 2**30
    how = "one copy (rank 0 loads, the others receive shards)" if loads_once else f"{ranks} copies (every rank)"
    plan = (
        f"host memory at load: {ranks} rank(s), {how} of {parameter_count(model_config) * load_bytes / 2**30:.1f} GiB: "
        f"~{peak / 2**30:,.0f} GiB of the node's {host_memory_gib:,.0f} GiB (at most {HOST_MEMORY_SHARE:.0%})"
    )
    if peak <= allowed:
        return plan
    raise StepError(
        f"parallel.devices_per_node: {plan}: it does not fit; load once (parallel.strategy fsdp, which loads on "
        "local rank 0 only) or run fewer ranks a node"
    )
