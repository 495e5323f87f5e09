"""What `train.method` means on the torch backend: how the base model loads, which adapter wraps it,
and how many parameters must end up trainable.

- lora: peft LoRA on the bf16 (or fp32) base;
- dora: peft's weight-decomposed LoRA (``use_dora``): LoRA plus one trainable magnitude per output
  row of every targeted layer;
- qlora: LoRA on a base quantized by bitsandbytes to 4-bit NF4 with double quantization, computing in
  bf16; the packed 4-bit weights are stored in bf16 tensors (``bnb_4bit_quant_storage``) so FSDP, which
  shards float tensors of one dtype, can shard them with the rest of the model;
- full: no adapter, every parameter trains.
"""

from __future__ import annotations

from typing import Any

from llm_pipeline.config import RunConfig
from llm_pipeline.training import lora_count
from llm_pipeline.training.plan import peft_lora_config

ADAPTER_METHODS = ("lora", "dora", "qlora")


def quantization_config(cfg: RunConfig):
    """The bitsandbytes settings for qlora (None for the other methods)."""
    if cfg.train.method != "qlora":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )


def model_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments for AutoModelForCausalLM.from_pretrained."""
    import torch

    bf16 = cfg.train.bf16 or cfg.train.method == "qlora"  # the 4-bit kernels compute in bf16
    kwargs: dict[str, Any] = {
        "dtype": torch.bfloat16 if bf16 else torch.float32,
        "attn_implementation": "sdpa" if cfg.train.attention == "auto" else cfg.train.attention,
    }
    quantization = quantization_config(cfg)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    return kwargs


def adapter_config(cfg: RunConfig):
    """The peft config for the adapter methods; None for full fine-tuning."""
    if cfg.train.method not in ADAPTER_METHODS:
        return None
    config = peft_lora_config(cfg.lora)
    config.use_dora = cfg.train.method == "dora"
    return config


def expected_trainable(model_config, cfg: RunConfig, total_parameters: int) -> int:
    """Trainable parameters the method must give: LoRA factors (+ DoRA magnitudes), or everything."""
    if cfg.train.method == "full":
        return total_parameters
    count = lora_count.expected_lora_parameters(model_config, cfg.lora)
    if cfg.train.method == "dora":
        count += lora_count.dora_magnitude_parameters(model_config, cfg.lora)
    return count
