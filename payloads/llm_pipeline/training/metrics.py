"""Model FLOPs utilisation and peak memory: the accounting (the torch engine adds both to every log event,
training/torch/watch.py; the training benchmark reports them).

FLOPs per trained token (the PaLM paper's appendix-B accounting, dense matmuls only):
- N = weights every token multiplies: per decoder layer q, k, v, o, gate, up, down; plus lm_head;
  the embedding is a lookup, not a matmul;
- forward = 2N + attention 4 * layers * seq_len * hidden (scores and the weighted sum);
- full fine-tuning: backward is twice the forward: 6N + 12 * layers * seq_len * hidden;
- adapter methods (lora/dora/qlora): frozen weights get no weight gradient, so the matmul
  backward halves: 4N + 12 * layers * seq_len * hidden (LoRA's own factors are negligible).
seq_len is the length of the example a token belongs to, averaged over the real tokens trained
(packed rows count each example's own length, padding counts nothing), not data.max_length.
MFU = tokens/s x FLOPs per token / (devices x peak dense bf16 FLOP/s of one device). The peak is
known for the GPUs this project runs on; elsewhere set HPL_PEAK_TFLOPS, or MFU is not reported.
"""

from __future__ import annotations

import os
import resource
import sys

# Dense bf16 tensor-core peak per device, TFLOP/s (NVIDIA data sheets, SXM parts, no sparsity).
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.05, "A10G": 70.0}


def matmul_parameters(model_config) -> int:
    """Weights a token passes through as matmuls: the decoder projections and lm_head."""
    hidden = model_config.hidden_size
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or hidden // heads
    kv = model_config.num_key_value_heads * head_dim
    inter = model_config.intermediate_size
    per_layer = hidden * heads * head_dim * 2 + hidden * kv * 2 + hidden * inter * 3
    return per_layer * model_config.num_hidden_layers + model_config.vocab_size * hidden


def flops_per_token(model_config, seq_len: float, *, full: bool) -> float:
    """Training FLOPs per token (see the module docstring)."""
    attention = 12 * model_config.num_hidden_layers * seq_len * model_config.hidden_size
    return (6 if full else 4) * matmul_parameters(model_config) + attention


def device_peak_flops(env: dict[str, str] | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of one device: HPL_PEAK_TFLOPS, else the CUDA device's table entry."""
    env = os.environ if env is None else env
    if env.get("HPL_PEAK_TFLOPS"):
        return float(env["HPL_PEAK_TFLOPS"]) * 1e12
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for model, tflops in PEAK_TFLOPS.items():
        if model in name:
            return tflops * 1e12
    return None


def mfu(tokens_per_second: float, flops_token: float, devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation, a fraction of the devices' combined peak."""
    return tokens_per_second * flops_token / (devices * peak_flops)


def peak_memory_bytes() -> int:
    """Peak memory of this process: CUDA allocations on a GPU, else the resident set (host RAM)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
