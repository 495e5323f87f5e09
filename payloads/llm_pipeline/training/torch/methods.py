"""What `train.method` means on the torch backend: how the base model loads, which adapter wraps it,
and how many parameters must end up trainable.

- lora: peft LoRA on the bf16 (or fp32) base;
- dora: peft's weight-decomposed LoRA (``use_dora``): LoRA plus one trainable magnitude per output
  row of every targeted layer;
- qlora: LoRA on a base quantized by bitsandbytes to 4-bit NF4 with double quantization, computing in
  bf16; the packed 4-bit weights are stored in bf16 tensors (``bnb_4bit_quant_storage``) so FSDP, which
  shards float tensors of one dtype, can shard them with the rest of the model;
- full: no adapter, every parameter trains.

Precision (every method and strategy, ``precision_dtypes``): trainable parameters, and so AdamW's
moments, are fp32 master weights; frozen base weights stay in the load dtype (bf16 with
``train.bf16``, or NF4 in bf16 storage); compute runs in bf16 (autocast on one process and DDP,
FSDP2's parameter dtype under FSDP2, parallel.py); loss and gradient reduction are fp32.
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


def load_dtype(cfg: RunConfig):
    """The dtype the base loads in: fp32 when every weight trains (they are the master weights), else the
    compute dtype (bf16 with train.bf16; always for qlora, whose 4-bit kernels compute in bf16)."""
    import torch

    if cfg.train.method == "full":
        return torch.float32
    return torch.bfloat16 if computes_in_bf16(cfg) else torch.float32


def computes_in_bf16(cfg: RunConfig) -> bool:
    """train.bf16, or qlora (bitsandbytes' 4-bit layers compute in bf16 whatever the flag says)."""
    return cfg.train.bf16 or cfg.train.method == "qlora"


def cuda_with(module: str, *, cuda: bool | None, installed: bool | None) -> bool:
    """The `auto` levers' rule: a CUDA device and `module` installed (either fact given wins, for tests)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if installed is None:
        import importlib.util

        installed = importlib.util.find_spec(module) is not None
    return cuda and installed


def attention_kernel(cfg: RunConfig, *, cuda: bool | None = None, flash_installed: bool | None = None) -> str:
    """train.attention, with auto resolved: flash-attention 2 on CUDA where flash-attn is installed (the
    CUDA image has it; packed rows then take its variable-length path), else sdpa."""
    if cfg.train.attention != "auto":
        return cfg.train.attention
    return "flash_attention_2" if cuda_with("flash_attn", cuda=cuda, installed=flash_installed) else "sdpa"


def liger_enabled(cfg: RunConfig, *, cuda: bool | None = None, liger_installed: bool | None = None) -> bool:
    """train.liger_kernel, with auto resolved: on on CUDA where liger-kernel is installed (the CUDA image;
    its kernels are Triton, GPU only), else off."""
    if cfg.train.liger_kernel != "auto":
        return cfg.train.liger_kernel
    return cuda_with("liger_kernel", cuda=cuda, installed=liger_installed)


def apply_liger(model) -> None:
    """liger-kernel's layer kernels (RMSNorm, RoPE, SwiGLU) on the loaded model, through transformers' own
    function; its fused linear cross entropy stays off, because trl's SFTTrainer patches the LM head with
    its own fused loss. The engine applies them itself instead of passing trl's ``use_liger_kernel``, which
    trl 1.16 deprecates (removed in trl 2.0, SFTTrainer.__init__). trl's replacement, transformers' Hub
    kernels (``use_kernels``), fetches kernels from the Hub at load time with the ``kernels`` package,
    which the images do not carry: the same liger-kernel pin does the same work here."""
    from transformers.integrations.liger import apply_liger_kernel

    apply_liger_kernel(model, {"fused_linear_cross_entropy": False})


def model_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments for AutoModelForCausalLM.from_pretrained."""
    kwargs: dict[str, Any] = {
        "dtype": load_dtype(cfg),
        "attn_implementation": attention_kernel(cfg),
    }
    quantization = quantization_config(cfg)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    return kwargs


def apply_precision(model, cfg: RunConfig) -> dict[str, int]:
    """Trainable parameters to fp32, frozen floating ones to the load dtype; 4-bit storage untouched.

    trl 0.24 prepares a 4-bit model differently by device (``trl/models/utils.py``): on CUDA it casts
    the frozen norms and embeddings to fp32 and the adapter stays fp32, on CPU (where it takes the
    base for a sharded one) the adapter stays bf16. Setting every dtype here afterwards gives FSDP2
    and the optimizer the same model on both. Returns the parameter count per dtype name.
    """
    import torch

    frozen_dtype = load_dtype(cfg)
    counts: dict[str, int] = {}
    for parameter in model.parameters():
        packed = parameter.__class__.__name__ == "Params4bit"
        if not packed and parameter.is_floating_point():
            wanted = torch.float32 if parameter.requires_grad else frozen_dtype
            if parameter.dtype != wanted:
                parameter.data = parameter.data.to(wanted)
        name = "nf4" if packed else str(parameter.dtype).removeprefix("torch.")
        counts[name] = counts.get(name, 0) + parameter.numel()
    return counts


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
