"""The (in, out) features of every module LoRA can adapt on a Llama-shaped model, from its config, and the number of
trainable parameters a LoRA (or DoRA) config must give on it.

One table for the trainer's expected parameter count (expected_lora_parameters) and the consolidated adapter's
shape check (weights/adapter_shapes). Training checks the real count against expected_lora_parameters and stops
when they differ: optimum-neuron issue #821 reports LoRA silently dropped and the whole model trained. Each adapted
linear layer of shape (in -> out) adds A [r, in] and B [out, r]; an adapted embedding adds A [r, vocab] and
B [hidden, r]. For Llama 3 8B, r=16 on q_proj and v_proj: 32 x (16*4096 + 4096*16 + 16*4096 + 1024*16) = 6,815,744.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_pipeline.config import LoraConfig


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


EMBEDDINGS = ("embed_tokens", "lm_head")


def layer_shapes(model_config) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each adaptable module of one decoder layer."""
    return {name: dims for name, dims in module_dims(vars(model_config)).items() if name not in EMBEDDINGS}


def expected_lora_parameters(
    model_config,
    lora: LoraConfig,
    *,
    dora: bool = False,
    fused_gate_up: bool = False,
    kv_size_multiplier: int | None = None,
) -> int:
    """Trainable parameters of `lora` on a Llama-shaped model.

    dora: DoRA adds one magnitude per output row of every targeted layer (embed_tokens with dora is refused by
    config.validate).
    fused_gate_up: the Neuron training model fuses gate_proj and up_proj into one layer whose LoRA
    A matrix is shared, so the pair costs r*hidden + 2*inter*r instead of twice r*(hidden + inter).
    kv_size_multiplier: set when the Neuron model fuses q/k/v into qkv_proj (TP above the KV heads,
    see neuron_rules): one A matrix is shared by q, k and v, and optimum-neuron counts the k and v
    B rows once per KV-head copy. Llama 3 8B, r=16 on q/k/v: 6,291,456 at TP 16, 8,388,608 at TP 32.
    """
    r = lora.r
    targets = set(lora.target_modules)
    shapes = layer_shapes(model_config)
    targeted = [dims for name, dims in shapes.items() if name in targets]
    per_layer = sum(r * (fan_in + fan_out) for fan_in, fan_out in targeted)
    if dora:
        per_layer += sum(fan_out for _, fan_out in targeted)
    if fused_gate_up and {"gate_proj", "up_proj"} <= targets:
        per_layer -= r * model_config.hidden_size
    if kv_size_multiplier is not None and {"q_proj", "k_proj", "v_proj"} <= targets:
        kv_out = shapes["k_proj"][1]
        per_layer -= 2 * r * model_config.hidden_size
        per_layer += 2 * r * kv_out * (kv_size_multiplier - 1)
    total = per_layer * model_config.num_hidden_layers
    vocab, hidden = model_config.vocab_size, model_config.hidden_size
    if "embed_tokens" in targets:
        total += r * (vocab + hidden)
    if "lm_head" in targets:
        total += r * (hidden + vocab) + (vocab if dora else 0)
    return total
