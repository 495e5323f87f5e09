"""The base weights a QLoRA adapter was trained against: each weight the 4-bit model holds, quantized to
NF4 and dequantized with bitsandbytes' own functions and the run's BitsAndBytesConfig.

Loading a model with a BitsAndBytesConfig turns every ``nn.Linear`` that transformers does not skip
(the output embeddings, tied weights, ``llm_int8_skip_modules``, the model's fp32 modules) into a
``bnb.nn.Linear4bit``, whose ``Params4bit`` quantizes the weight in the load dtype with
``bitsandbytes.functional.quantize_4bit``; its forward computes with the dequantized weight in the compute
dtype. ``RoundTrip`` repeats exactly that on one whole weight (double quantization subtracts the mean
of the tensor's block scales, so a weight cannot be split into row blocks), and ``quantized_weights``
names the weights it applies to, found with transformers' own skip rules on an empty (meta) model.
Imports torch, transformers and bitsandbytes: used only for qlora merges.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def quantized_weights(model_dir: Path, quantization) -> frozenset[str]:
    """Names of the weights that loading ``model_dir`` with ``quantization`` holds in 4-bit."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    skipped = [
        *get_keys_to_not_convert(model),
        *(quantization.llm_int8_skip_modules or []),
        *(model._keep_in_fp32_modules or []),
    ]
    return frozenset(
        f"{name}.weight"
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear and should_convert_module(name, skipped)
    )


class RoundTrip:
    """A whole fp32 weight -> the weight the 4-bit layer computes with (as fp32 values)."""

    def __init__(self, quantization, load_dtype) -> None:
        import bitsandbytes as bnb
        import torch

        self.quantization, self.load_dtype = quantization, load_dtype
        # transformers passes no blocksize: Params4bit's own default is what the 4-bit model uses
        self.blocksize = bnb.nn.Params4bit(torch.empty(0), requires_grad=False).blocksize

    def __call__(self, weight: np.ndarray) -> np.ndarray:
        import bitsandbytes.functional as bnbf
        import torch

        q = self.quantization
        packed, state = bnbf.quantize_4bit(
            torch.from_numpy(weight).to(self.load_dtype).contiguous(),
            blocksize=self.blocksize,
            compress_statistics=q.bnb_4bit_use_double_quant,
            quant_type=q.bnb_4bit_quant_type,
            quant_storage=q.bnb_4bit_quant_storage,
        )
        dequantized = bnbf.dequantize_4bit(packed, state).to(q.bnb_4bit_compute_dtype)
        return dequantized.float().numpy()
