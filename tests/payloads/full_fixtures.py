"""Full-model checkpoints as optimum-neuron 0.4.5 saves them under tensor parallelism (test writer).

``shard_full_model`` splits a Hugging Face Llama state dict the way the Neuron training model holds
it (models/training/llama/modeling_llama.py and transformations_utils.py at v0.4.5):
vocab-parallel ``embed_tokens`` and column-parallel ``lm_head`` split on rows; ``gate_up_proj``
fused per rank (gate's slice then up's, stride 2); q/k/v column-parallel, or fused ``qkv_proj``
(stride 3) when ``fuse_qkv`` and heads == KV heads, or the GQA ``qkv_proj`` (``weight_q/k/v`` or
``weight_qkv``; k/v repeated ``kv_size_multiplier`` times; q rows and o_proj columns grouped per
rank by KV head) when TP does not divide the KV heads; o_proj/down_proj row-parallel; norms
replicated. test_consolidate_full checks these pieces against optimum-neuron's own reader.
``write_full_checkpoint`` lays the result out as ``checkpoint-N/`` with ``shards/``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from merge_fixtures import _rows_of_heads, query_heads_on_rank
from nxd_files import save_rank_file


def _split(dim: int, tp: int, stride: int = 1) -> dict:
    return {"tensor_model_parallel": True, "partition_dim": dim, "partition_stride": stride, "num_partitions": tp}


REPLICATED = {"tensor_model_parallel": False}


def shard_full_model(state: dict[str, torch.Tensor], config: dict, tp: int, *, fuse_qkv: bool = False):
    """(per-rank {name: tensor} dicts, mp_metadata dict) for one pipeline stage holding every layer."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // heads
    gqa = kv_heads < tp or kv_heads % tp != 0
    multiplier = max(1, tp // kv_heads) if gqa else 1
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    params: dict[str, dict] = {}
    specs: list[dict] = []

    def put(name: str, pieces: list[torch.Tensor], meta: dict) -> None:
        for rank, piece in enumerate(pieces):
            ranks[rank][name] = piece.clone().contiguous()
        params[name] = meta

    put("model.embed_tokens.weight", list(state["model.embed_tokens.weight"].chunk(tp)), _split(0, tp))
    for layer in range(config["num_hidden_layers"]):
        attn, mlp = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
        q, k, v, o = (state[f"{attn}.{m}_proj.weight"] for m in "qkvo")
        attention_specs: list = []
        if gqa:
            held = [query_heads_on_rank(r, tp, heads, kv_heads, multiplier) for r in range(tp)]
            q_parts = [_rows_of_heads(q, held[r], head_dim, 0) for r in range(tp)]
            k_parts, v_parts = (list(w.repeat(multiplier, 1).chunk(tp)) for w in (k, v))
            if fuse_qkv:  # neuronx-distributed sets no TP attributes on weight_qkv
                put(
                    f"{attn}.qkv_proj.weight_qkv",
                    [torch.cat(t) for t in zip(q_parts, k_parts, v_parts, strict=True)],
                    REPLICATED,
                )
            else:
                for part, pieces in zip("qkv", (q_parts, k_parts, v_parts), strict=True):
                    put(f"{attn}.qkv_proj.weight_{part}", pieces, _split(0, tp))
            put(f"{attn}.o_proj.weight", [_rows_of_heads(o, held[r], head_dim, 1) for r in range(tp)], _split(1, tp))
            attention_specs.append(
                ["GQAQKVColumnParallelLinearSpec", {
                    "gqa_qkv_projection_name": "qkv_proj", "query_projection_name": "q_proj",
                    "key_projection_name": "k_proj", "value_projection_name": "v_proj",
                    "output_projection_name": "o_proj", "num_attention_heads": heads,
                    "num_key_value_heads": kv_heads, "kv_size_multiplier": multiplier,
                    "q_output_size_per_partition": hidden // tp,
                    "kv_output_size_per_partition": kv_heads * multiplier * head_dim // tp,
                    "fuse_qkv": fuse_qkv, "bias": False, "tp_size": tp, "peft_type": None,
                }]
            )  # fmt: skip
        else:
            if fuse_qkv and heads == kv_heads:
                chunks = [w.chunk(tp) for w in (q, k, v)]
                put(f"{attn}.qkv_proj.weight", [torch.cat([c[r] for c in chunks]) for r in range(tp)], _split(0, tp, 3))
                attention_specs.append(
                    ["FusedLinearsSpec", {
                        "fused_linear_name": "qkv_proj", "linear_names": ["q_proj", "k_proj", "v_proj"],
                        "bias": False, "fuse_axis": 0, "original_dims": [hidden] * 3, "tp_size": tp, "peft_type": None,
                    }]
                )  # fmt: skip
            else:
                for name, weight in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    put(f"{attn}.{name}.weight", list(weight.chunk(tp)), _split(0, tp))
            put(f"{attn}.o_proj.weight", list(o.chunk(tp, 1)), _split(1, tp))
        specs.append({"module_fully_qualified_name": attn, "specs": attention_specs})
        gate, up = (state[f"{mlp}.{m}_proj.weight"].chunk(tp) for m in ("gate", "up"))
        put(f"{mlp}.gate_up_proj.weight", [torch.cat(pair) for pair in zip(gate, up, strict=True)], _split(0, tp, 2))
        put(f"{mlp}.down_proj.weight", list(state[f"{mlp}.down_proj.weight"].chunk(tp, 1)), _split(1, tp))
        specs.append(
            {"module_fully_qualified_name": mlp, "specs": [["FusedLinearsSpec", {
                "fused_linear_name": "gate_up_proj", "linear_names": ["gate_proj", "up_proj"], "bias": False,
                "fuse_axis": 0, "original_dims": [intermediate] * 2, "tp_size": tp, "peft_type": None,
            }]]}
        )  # fmt: skip
        for norm in ("input_layernorm", "post_attention_layernorm"):
            name = f"model.layers.{layer}.{norm}.weight"
            put(name, [state[name]] * tp, REPLICATED)
    put("model.norm.weight", [state["model.norm.weight"]] * tp, REPLICATED)
    put("lm_head.weight", list(state["lm_head.weight"].chunk(tp)), _split(0, tp))
    return ranks, {"parameters": params, "model_weight_transformation_specs": specs}


def write_full_checkpoint(
    checkpoint: Path,
    model_dir: Path,
    ranks: list[dict[str, torch.Tensor]],
    metadata: dict,
    *,
    xser: bool,
    done: bool = True,
    with_optimizer: bool = False,
) -> Path:
    """checkpoint-N/ as optimum-neuron saves a full model: HF config + tokenizer, trainer state, shards/.

    Without the optimizer by default, as the neuron engine saves (save_only_model); with_optimizer adds
    the ZeRO-1 state files optimum-neuron writes otherwise."""
    shards = checkpoint / "shards"
    (shards / "model").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, checkpoint / name)
    (checkpoint / "trn_config.json").write_text(json.dumps({"tensor_parallel_size": len(ranks)}))
    (shards / "checkpoint").write_text("1")
    (shards / "mp_metadata_pp_rank_0.json").write_text(json.dumps(metadata, indent=4))
    for rank, tensors in enumerate(ranks):
        save_rank_file(shards / "model" / f"dp_rank_00_tp_rank_{rank:02d}_pp_rank_00.pt", tensors, xser=xser)
    if with_optimizer:  # ZeRO-1 state: one file per DP rank, never read by consolidation
        (shards / "optim").mkdir(exist_ok=True)
        torch.save({"state": {}}, shards / "optim" / "dp_rank_00_tp_rank_00_pp_rank_00.pt")
    if done:
        (shards / "done").write_text("1")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": int(checkpoint.name.split("-")[-1])}))
    return checkpoint
