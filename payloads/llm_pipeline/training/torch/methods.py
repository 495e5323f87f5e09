"""What `train.method` means on the torch backend: how the base model loads, which adapter wraps it,
and how many parameters must end up trainable.

- lora: peft LoRA on the bf16 (or fp32) base;
- dora: peft's weight-decomposed LoRA (``use_dora``): LoRA plus one trainable magnitude per output
  row of every targeted layer;
- qlora: LoRA on a base quantized by bitsandbytes to 4-bit NF4 with double quantization, computing in
  bf16; the packed 4-bit weights are stored in bf16 tensors (``bnb_4bit_quant_storage``) so FSDP, which
  shards float tensors of one dtype, can shard them with the rest of the model;
- full: no adapter, every parameter trains.

Every rule here reads the run's model part (training/parts.ModelPart), never the whole config.

Precision (every method and strategy, ``precision_dtypes``): trainable parameters, and so AdamW's
moments, are fp32 master weights; frozen base weights stay in the load dtype (bf16 with
``train.bf16``, or NF4 in bf16 storage); compute runs in bf16 (autocast on one process and DDP,
FSDP2's parameter dtype under FSDP2, parallel.py); loss and gradient reduction are fp32.
"""

from __future__ import annotations

from typing import Any

from llm_pipeline import model_shapes
from llm_pipeline.errors import StepError
from llm_pipeline.training.parts import ModelPart
from llm_pipeline.training.plan import adapter_config, check_target_modules


def quantization_config(part: ModelPart):
    """The bitsandbytes settings for qlora (None for the other methods)."""
    if part.method != "qlora":
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


def load_dtype(part: ModelPart):
    """The dtype the base loads in: fp32 when every weight trains (they are the master weights), else the
    compute dtype (bf16 with train.bf16; always for qlora, whose 4-bit kernels compute in bf16)."""
    import torch

    if part.method == "full":
        return torch.float32
    return torch.bfloat16 if computes_in_bf16(part) else torch.float32


def computes_in_bf16(part: ModelPart) -> bool:
    """train.bf16, or qlora (bitsandbytes' 4-bit layers compute in bf16 whatever the flag says)."""
    return part.bf16 or part.method == "qlora"


def cuda_with(module: str, *, cuda: bool | None, installed: bool | None) -> bool:
    """The `auto` levers' rule: a CUDA device and `module` installed (either fact given wins, for tests)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if installed is None:
        import importlib.util

        installed = importlib.util.find_spec(module) is not None
    return cuda and installed


def attention_kernel(part: ModelPart, *, cuda: bool | None = None, flash_installed: bool | None = None) -> str:
    """train.attention, with auto resolved: flash-attention 2 on CUDA where flash-attn is installed (the
    CUDA image has it; packed rows then take its variable-length path), else sdpa."""
    if part.attention != "auto":
        return part.attention
    return "flash_attention_2" if cuda_with("flash_attn", cuda=cuda, installed=flash_installed) else "sdpa"


def liger_enabled(part: ModelPart, *, cuda: bool | None = None, liger_installed: bool | None = None) -> bool:
    """train.liger_kernel, with auto resolved: on on CUDA where liger-kernel is installed (the CUDA image;
    its kernels are Triton, GPU only), else off."""
    if part.liger_kernel != "auto":
        return part.liger_kernel
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


def model_kwargs(part: ModelPart) -> dict[str, Any]:
    """Keyword arguments for AutoModelForCausalLM.from_pretrained."""
    kwargs: dict[str, Any] = {
        "dtype": load_dtype(part),
        "attn_implementation": attention_kernel(part),
    }
    quantization = quantization_config(part)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    return kwargs


def load_model(part: ModelPart, *, empty: bool = False):
    """The base model from paths.model_dir; ``empty``: no weights read, for a rank that receives them
    from rank 0 (parallel.loads_once)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = model_kwargs(part)
    if empty:
        return empty_model(part, kwargs)
    if part.method == "qlora" and torch.cuda.is_available():
        kwargs["device_map"] = {"": torch.cuda.current_device()}  # quantize on this rank's GPU
    try:
        return AutoModelForCausalLM.from_pretrained(part.model_dir, **kwargs)
    except ImportError as exc:  # flash-attn or bitsandbytes missing from this runtime
        raise StepError(f"train.attention / train.method: {exc}") from None


def empty_model(part: ModelPart, kwargs):
    """The model with its buffers computed and its parameters allocated but never written (torch.empty:
    pages that are never touched are never resident). Real CPU storage, not the meta device, because
    accelerate's FSDP2 preparation maps the optimizer's parameters to the sharded ones by storage address,
    and every meta tensor has the same one; accelerate then broadcasts rank 0's weights into the shards."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(part.model_dir), **kwargs)
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            storage = torch.empty_like(parameter, device="cpu")
            module._parameters[name] = torch.nn.Parameter(storage, requires_grad=parameter.requires_grad)
    model.tie_weights()
    return model


def method_model(part: ModelPart, *, empty: bool = False):
    """(the model as the method trains it, its adapter's peft config or None, the trainable parameters the method
    must give): the base loaded (``empty``: load_model), liger's kernels applied when on, the count from its
    shape (expected_trainable), the adapter's targets checked against the model."""
    model = load_model(part, empty=empty)
    if liger_enabled(part):
        apply_liger(model)
    expected = expected_trainable(model.config, part, sum(p.numel() for p in model.parameters()))
    peft_config = adapter_config(part.method, part.lora)
    if peft_config is not None:
        check_target_modules(model, part.lora)
    return model, peft_config, expected


def apply_precision(model, part: ModelPart) -> dict[str, int]:
    """Trainable parameters to fp32, frozen floating ones to the load dtype; 4-bit storage untouched.

    trl 0.24 prepares a 4-bit model differently by device (``trl/models/utils.py``): on CUDA it casts
    the frozen norms and embeddings to fp32 and the adapter stays fp32, on CPU (where it takes the
    base for a sharded one) the adapter stays bf16. Setting every dtype here afterwards gives FSDP2
    and the optimizer the same model on both. Returns the parameter count per dtype name.
    """
    import torch

    frozen_dtype = load_dtype(part)
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


def expected_trainable(model_config, part: ModelPart, total_parameters: int) -> int:
    """Trainable parameters the method must give: LoRA factors (+ DoRA magnitudes), or everything."""
    if part.method == "full":
        return total_parameters
    return model_shapes.expected_lora_parameters(model_config, part.lora, dora=part.method == "dora")
