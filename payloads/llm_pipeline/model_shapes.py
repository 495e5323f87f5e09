"""The (in, out) features of every module LoRA can adapt on a Llama-shaped model, from its config.

One table for the trainer's expected parameter count (training/lora_count) and the consolidated
adapter's shape check (weights/adapter_shapes). Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def module_dims(model_config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of every module LoRA can adapt on a Llama-shaped model."""
    hidden, heads = model_config["hidden_size"], model_config["num_attention_heads"]
    head_dim = model_config.get("head_dim") or hidden // heads
    kv = model_config.get("num_key_value_heads", heads) * head_dim
    inter, vocab = model_config["intermediate_size"], model_config["vocab_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
        "embed_tokens": (vocab, hidden),
        "lm_head": (hidden, vocab),
    }
