"""Synthetic full-model checkpoints laid out as optimum-neuron 0.4.5 saves them under TP (for benchmarks).

Names, per-rank shapes, metadata and file forms are the real ones for a Llama of ``shape`` at ``tp``
(vocab-parallel embed/lm_head, fused gate_up with stride 2, q/k/v column-parallel, or the GQA qkv
layer when TP does not divide the KV heads, row-parallel o/down, replicated norms); values are
one random block tiled, so writing costs what the disk costs. Correctness of the layout itself is
tested with real tiny models in tests/payloads/test_consolidate_full.py.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.synthetic_llama import LlamaShape, write_side_files

REPO = Path(__file__).resolve().parents[1]


def _split(dim: int, tp: int, stride: int = 1) -> dict:
    return {"tensor_model_parallel": True, "partition_dim": dim, "partition_stride": stride, "num_partitions": tp}


def rank_layout(shape: LlamaShape, tp: int) -> tuple[dict[str, tuple[int, ...]], dict]:
    """(per-rank piece shape of every saved tensor, in save order; mp_metadata)."""
    hidden, inter, hd = shape.hidden, shape.intermediate, shape.head_dim
    gqa = shape.kv_heads < tp or shape.kv_heads % tp != 0
    multiplier = max(1, tp // shape.kv_heads) if gqa else 1
    pieces: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab // tp, hidden)}
    params: dict[str, dict] = {"model.embed_tokens.weight": _split(0, tp)}
    specs = []
    for layer in range(shape.layers):
        attn, mlp = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
        if gqa:
            kv_rows = shape.kv_heads * multiplier * hd // tp
            for part, rows in (("q", hidden // tp), ("k", kv_rows), ("v", kv_rows)):
                pieces[f"{attn}.qkv_proj.weight_{part}"] = (rows, hidden)
                params[f"{attn}.qkv_proj.weight_{part}"] = _split(0, tp)
            spec = {
                "gqa_qkv_projection_name": "qkv_proj", "query_projection_name": "q_proj",
                "key_projection_name": "k_proj", "value_projection_name": "v_proj",
                "output_projection_name": "o_proj", "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.kv_heads, "kv_size_multiplier": multiplier,
                "q_output_size_per_partition": hidden // tp, "kv_output_size_per_partition": kv_rows,
                "fuse_qkv": False, "bias": False, "tp_size": tp, "peft_type": None,
            }  # fmt: skip
            specs.append({"module_fully_qualified_name": attn, "specs": [["GQAQKVColumnParallelLinearSpec", spec]]})
        else:
            for proj, rows in (("q_proj", hidden), ("k_proj", shape.kv_heads * hd), ("v_proj", shape.kv_heads * hd)):
                pieces[f"{attn}.{proj}.weight"] = (rows // tp, hidden)
                params[f"{attn}.{proj}.weight"] = _split(0, tp)
            specs.append({"module_fully_qualified_name": attn, "specs": []})
        pieces[f"{attn}.o_proj.weight"], params[f"{attn}.o_proj.weight"] = (hidden, hidden // tp), _split(1, tp)
        pieces[f"{mlp}.gate_up_proj.weight"] = (2 * inter // tp, hidden)
        params[f"{mlp}.gate_up_proj.weight"] = _split(0, tp, 2)
        pieces[f"{mlp}.down_proj.weight"], params[f"{mlp}.down_proj.weight"] = (hidden, inter // tp), _split(1, tp)
        fused = {
            "fused_linear_name": "gate_up_proj", "linear_names": ["gate_proj", "up_proj"], "bias": False,
            "fuse_axis": 0, "original_dims": [inter, inter], "tp_size": tp, "peft_type": None,
        }  # fmt: skip
        specs.append({"module_fully_qualified_name": mlp, "specs": [["FusedLinearsSpec", fused]]})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            pieces[f"model.layers.{layer}.{norm}.weight"] = (hidden,)
            params[f"model.layers.{layer}.{norm}.weight"] = {"tensor_model_parallel": False}
    pieces["model.norm.weight"], params["model.norm.weight"] = (hidden,), {"tensor_model_parallel": False}
    pieces["lm_head.weight"], params["lm_head.weight"] = (shape.vocab // tp, hidden), _split(0, tp)
    return pieces, {"parameters": params, "model_weight_transformation_specs": specs}


def write_checkpoint(checkpoint: Path, shape: LlamaShape, tp: int, *, xser: bool = True, seed: int = 0) -> int:
    """checkpoint-N/ with config, tokenizer, trainer state and shards/; returns the rank files' bytes."""
    import torch

    sys.path.insert(0, str(REPO / "tests" / "payloads"))
    from nxd_files import save_rank_file

    pieces, metadata = rank_layout(shape, tp)
    block = (torch.randn(32 * 1024 * 1024, generator=torch.Generator().manual_seed(seed)) * 0.02).to(torch.bfloat16)

    def tensor(dims: tuple[int, ...]) -> torch.Tensor:
        count = math.prod(dims)
        repeats = -(-count // block.numel())
        return (block.repeat(repeats) if repeats > 1 else block)[:count].clone().view(dims)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, dims in pieces.items():
            yield name, tensor(dims)

    shards = checkpoint / "shards"
    (shards / "model").mkdir(parents=True, exist_ok=True)
    (shards / "checkpoint").write_text("1")
    (shards / "mp_metadata_pp_rank_0.json").write_text(json.dumps(metadata, indent=4))
    for rank in range(tp):
        path = shards / "model" / f"dp_rank_00_tp_rank_{rank:02d}_pp_rank_00.pt"
        save_rank_file(path, stream() if xser else dict(stream()), xser=xser)
    (shards / "done").write_text("1")
    write_side_files(checkpoint, shape, "bfloat16")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    return sum(p.stat().st_size for p in (shards / "model").rglob("*") if p.is_file())
