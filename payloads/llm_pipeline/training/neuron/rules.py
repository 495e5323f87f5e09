"""What optimum-neuron 0.4.5 allows and how it lays out a run, checked before anything starts.

Stdlib only, so the prepare step can run these checks (with the model's config.json when the model
folder exists) and the train step runs them again before loading anything.

- Packing: the Neuron Llama recomputes a causal mask and ignores the attention mask
  (``recompute_causal_mask``), so packed examples would attend to each other. Refused.
- Tensor parallelism above the KV-head count (TP 16/32 on Llama 3 8B): q/k/v become one fused
  ``qkv_proj`` whose KV heads are replicated ``kv_size_multiplier`` times, and optimum-neuron
  refuses a LoRA config that targets only some of q/k/v.
- Attention: optimum-neuron 0.4.5 runs eager attention or, with ``attn_implementation=
  "flash_attention_2"``, neuronx-distributed's NKI flash-attention kernel; SDPA raises. The kernel
  (neuronx-distributed 2.26, ``kernels/flash_attn.py``, ``nki_flash_attn_func``) raises
  NotImplementedError unless the sequence length is a multiple of 2048, and every batch is exactly
  ``data.max_length`` wide (training/collator.py). ``attention_kernel`` decides once, for the
  precompile run and the real run alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError

QKV = ("q_proj", "k_proj", "v_proj")
FLASH_ATTENTION = "flash_attention_2"  # optimum-neuron's name for the NKI kernel (models/training/modeling_utils.py)
EAGER_ATTENTION = "eager"
FLASH_SEQUENCE_MULTIPLE = 2048  # the kernel's length rule (neuronx-distributed 2.26 kernels/flash_attn.py)


def kv_size_multiplier(kv_heads: int, tensor_parallel_size: int) -> int | None:
    """None when q/k/v stay separate layers; else how often each KV head is replicated in qkv_proj.

    optimum-neuron 0.4.5 fuses q/k/v when the KV heads are fewer than the TP ranks or not a multiple
    of them (modeling_llama.py), with the smallest multiplier tp // kv_heads (at least 1).
    """
    if kv_heads >= tensor_parallel_size and kv_heads % tensor_parallel_size == 0:
        return None
    return max(1, tensor_parallel_size // kv_heads)


def check_qkv_targets(cfg: RunConfig, model_config: Mapping[str, Any], source: str) -> None:
    """With fused q/k/v, LoRA must target all three or none (else optimum-neuron raises mid-launch)."""
    tp = cfg.parallel.tensor_parallel_size
    kv_heads = int(model_config["num_key_value_heads"])
    if kv_size_multiplier(kv_heads, tp) is None:
        return
    targeted = [name for name in QKV if name in cfg.lora.target_modules]
    if targeted and len(targeted) != len(QKV):
        raise StepError(
            f"parallel.tensor_parallel_size = {tp} is above the {kv_heads} KV heads of the model ({source}), so "
            f"optimum-neuron fuses q_proj, k_proj and v_proj into one qkv_proj: lora.target_modules must name all "
            f"three or none of them (it names {', '.join(targeted)}); or choose a tensor_parallel_size that "
            f"divides {kv_heads}"
        )


def attention_kernel(cfg: RunConfig) -> str:
    """The attn_implementation handed to optimum-neuron: train.attention, with ``auto`` resolved by length.

    auto: the flash kernel when data.max_length is a multiple of 2048 (its memory grows linearly with
    the length, eager's quadratically), eager otherwise. An explicit choice is kept; check_attention
    refuses one that cannot run.
    """
    if cfg.train.attention != "auto":
        return cfg.train.attention
    return FLASH_ATTENTION if cfg.data.max_length % FLASH_SEQUENCE_MULTIPLE == 0 else EAGER_ATTENTION


def check_attention(cfg: RunConfig) -> None:
    """An explicit flash_attention_2 must fit the kernel's length rule (sdpa is refused with the config: config.py)."""
    chosen, length = cfg.train.attention, cfg.data.max_length
    if chosen == FLASH_ATTENTION and length % FLASH_SEQUENCE_MULTIPLE:
        padded = -(-length // FLASH_SEQUENCE_MULTIPLE) * FLASH_SEQUENCE_MULTIPLE
        raise StepError(
            f"train.attention = '{FLASH_ATTENTION}' with data.max_length = {length}: neuronx-distributed's NKI "
            f"flash-attention kernel only runs sequences that are a multiple of {FLASH_SEQUENCE_MULTIPLE} tokens "
            f"(it raises NotImplementedError after the model loads); set data.max_length = {padded}, or "
            f"train.attention = 'auto' or '{EAGER_ATTENTION}'"
        )


def check_neuron_run(cfg: RunConfig, model_config: Mapping[str, Any] | None, source: str = "config.json") -> None:
    """Every rule above; the model-dependent ones only when the model's config is known."""
    check_attention(cfg)  # packing: refusals.REFUSALS (config.check_backend)
    if model_config is not None and cfg.train.method != "full":  # full fine-tuning has no LoRA targets
        check_qkv_targets(cfg, model_config, source)
