"""Our sharded-layout writer and reader agree with the installed optimum-neuron's own split functions.

optimum-neuron's transformations_utils cannot be imported here (it needs neuronx_distributed), so
the pure-torch functions that split weights for a TP rank are compiled from its source and run with
the TP size and rank bound to fixed values: the real code, not a copy kept in this repo.
"""

from __future__ import annotations

import ast
import importlib.util
import types
from pathlib import Path
from typing import Literal

import pytest
import torch
from merge_fixtures import ATTENTION, MLP, Shape, full_adapter, shard_adapter

from llm_pipeline.weights.tp_layout import query_head_order

pytestmark = pytest.mark.trn1

WANTED = {
    "compute_query_indices_for_rank",
    "create_query_or_output_projection_local_weight_from_regular_weight",
    "create_kv_proj_local_weight_from_regular_weight",
    "create_local_fused_weight",
}


def upstream_functions(tp: int, rank: int) -> dict:
    """The wanted functions from optimum-neuron's source, with TP size/rank fixed."""
    package = Path(importlib.util.find_spec("optimum.neuron").submodule_search_locations[0])
    tree = ast.parse((package / "models/training/transformations_utils.py").read_text())
    found = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in WANTED]
    assert {node.name for node in found} == WANTED, "optimum-neuron changed: update the contract"
    namespace: dict = {
        "torch": torch,
        "Literal": Literal,
        "get_tensor_model_parallel_size": lambda: tp,
        "get_tensor_model_parallel_rank": lambda: rank,
    }
    for node in found:
        node.decorator_list = []
        exec(compile(ast.Module(body=[node], type_ignores=[]), "transformations_utils.py", "exec"), namespace)
    namespace["GQAQKVColumnParallelLinearSpec"] = types.SimpleNamespace(**{name: namespace[name] for name in WANTED})
    return namespace


@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(8, 2, 4), (8, 2, 8), (32, 8, 32), (32, 8, 16), (16, 4, 8)])
def test_query_head_order_matches_upstream(heads, kv_heads, tp):
    multiplier = max(1, tp // kv_heads)
    upstream = upstream_functions(tp, 0)["compute_query_indices_for_rank"]
    expected = torch.cat([upstream(tp, rank, heads, kv_heads, multiplier) for rank in range(tp)]).tolist()
    assert query_head_order(tp, heads, kv_heads, multiplier) == expected


@pytest.mark.parametrize("tp", [4, 8])
def test_gqa_writer_matches_upstream_split(tp):
    shape = Shape(kv_heads=2)
    multiplier = tp // shape.kv_heads
    full = full_adapter(shape, ATTENTION)
    ranks, metadata = shard_adapter(shape, full, tp)
    layer = "base_model.model.model.layers.0.self_attn"
    for rank in range(tp):
        fns = upstream_functions(tp, rank)
        q = fns["create_query_or_output_projection_local_weight_from_regular_weight"](
            full[f"{layer}.q_proj.lora_B.weight"], shape.heads, shape.kv_heads, multiplier, "query"
        )
        assert torch.equal(ranks[rank][f"{layer}.qkv_proj.lora_B.weight_q"], q)
        o = fns["create_query_or_output_projection_local_weight_from_regular_weight"](
            full[f"{layer}.o_proj.lora_A.weight"], shape.heads, shape.kv_heads, multiplier, "output"
        )
        assert torch.equal(ranks[rank][f"{layer}.o_proj.lora_A.weight"], o)
        kv_rows = shape.kv_heads * multiplier * shape.head_dim // tp
        k = fns["create_kv_proj_local_weight_from_regular_weight"](
            full[f"{layer}.k_proj.lora_B.weight"].clone(), multiplier, kv_rows
        )
        assert torch.equal(ranks[rank][f"{layer}.qkv_proj.lora_B.weight_k"], k)
    spec = metadata["model_weight_transformation_specs"][0]["specs"][0][1]
    assert (spec["q_output_size_per_partition"], spec["kv_output_size_per_partition"]) == (shape.hidden // tp, kv_rows)


@pytest.mark.parametrize("tp", [2, 8])
def test_gate_up_writer_matches_upstream_fused_split(tp):
    shape = Shape()
    full = full_adapter(shape, MLP)
    ranks, _ = shard_adapter(shape, full, tp)
    mlp = "base_model.model.model.layers.1.mlp"
    for rank in range(tp):
        fused = upstream_functions(tp, rank)["create_local_fused_weight"](
            rank, tp, [full[f"{mlp}.gate_proj.lora_B.weight"], full[f"{mlp}.up_proj.lora_B.weight"]], 0, 0
        )
        assert torch.equal(ranks[rank][f"{mlp}.gate_up_proj.lora_B.weight"], fused)
