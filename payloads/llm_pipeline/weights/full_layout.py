"""Plan how the full weights of a tensor-parallel model checkpoint map back to Hugging Face tensors.

optimum-neuron 0.4.5 saves a full model (``checkpoint-N/shards/model/dp_rank_00_tp_rank_TT_pp_rank_PP.pt``)
with its own module names; ``mp_metadata_pp_rank_<p>.json`` lists every parameter's split and the
transformation specs of the fused modules:

- FusedLinearsSpec (``gate_up_proj``, and ``qkv_proj`` when ``fuse_qkv`` and heads == KV heads): each
  rank holds its slice of every original linear, one after the other along ``fuse_axis``;
- GQAQKVColumnParallelLinearSpec (``qkv_proj`` when TP does not divide the KV heads): ``weight_q``,
  ``weight_k``, ``weight_v`` (or one ``weight_qkv``); k/v repeated ``kv_size_multiplier`` times before
  the split (keep one copy); q rows and o_proj columns grouped per rank by KV head (undo the order);
- everything else is split on ``partition_dim`` (vocab-parallel embedding and lm_head: rows) or
  replicated (norms).

The plan is made from names and shapes only (no tensor data), so the output file layout is known
before anything is read; each Unit then rebuilds a few HF tensors from its rank pieces, as row
blocks: joins along rows (vocab-parallel and column-parallel weights, the halves of gate_up, query
heads put back in order) are views of the pieces written one after the other, never copied; only
joins along columns (row-parallel o_proj/down_proj) build the tensor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.tp_layout import (
    check_partition_counts,
    join_shards,
    one_kv_copy,
    query_head_order,
    restore_head_order,
    transformation_specs,
)

Pieces = dict[str, list[torch.Tensor]]  # rank-file name -> its tensor on every TP rank, in rank order
Blocks = list[torch.Tensor]  # a tensor as contiguous pieces that, concatenated along dim 0, make it
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class OutputTensor:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class Unit:
    """Some HF tensors rebuilt together from the same rank-file tensors (a fused module, or one tensor)."""

    sources: list[str]
    outputs: list[OutputTensor]
    rebuild: Callable[[Pieces], dict[str, Blocks]] = field(repr=False)

    @property
    def layer(self) -> int:
        """Decoder layer index (-1 before the layers, a large number after), for ordering and batching."""
        match = _LAYER.search(self.outputs[0].name + ".")
        if match:
            return int(match[1])
        return -1 if "embed" in self.outputs[0].name else 1 << 30


@dataclass(frozen=True)
class RankShapes:
    """Names, shapes and dtypes of one pipeline stage's tensors (TP rank 0; other ranks are checked equal)."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]


def _scaled(shape: tuple[int, ...], dim: int, factor: float) -> tuple[int, ...]:
    return tuple(int(size * factor) if axis == dim else size for axis, size in enumerate(shape))


def _fused_unit(module: str, spec: dict, ranks: RankShapes, params: dict, tp: int) -> Unit | None:
    fused = f"{module}.{spec['fused_linear_name']}"
    kinds = ["weight", "bias"] if spec.get("bias") else ["weight"]
    if f"{fused}.weight" not in ranks.shapes:
        return None
    axis = {"column": 0, "row": 1}.get(spec["fuse_axis"], spec["fuse_axis"])
    sizes = [dim // tp for dim in spec["original_dims"]]
    outputs, sources = [], []
    for kind in kinds:
        source = f"{fused}.{kind}"
        piece = ranks.shapes[source]
        if piece[axis] != sum(sizes):
            raise CheckpointError(
                f"{source} has {piece[axis]} rows per rank on dim {axis}; the spec implies {sum(sizes)}"
            )
        dim = params.get(source, {}).get("partition_dim", 0) if kind == "weight" else 0
        sources.append(source)
        for linear, size in zip(spec["linear_names"], sizes, strict=True):
            shape = _scaled(_scaled(piece, axis, size / piece[axis]), dim, tp)
            outputs.append(OutputTensor(f"{module}.{linear}.{kind}", shape, ranks.dtypes[source]))

    def rebuild(pieces: Pieces) -> dict[str, Blocks]:
        rebuilt = {}
        for source, kind in zip(sources, kinds, strict=True):
            dim = params.get(source, {}).get("partition_dim", 0) if kind == "weight" else 0
            parts = [piece.split(sizes, dim=axis) for piece in pieces[source]]
            for index, linear in enumerate(spec["linear_names"]):
                rebuilt[f"{module}.{linear}.{kind}"] = join_blocks([p[index] for p in parts], dim)
        return rebuilt

    return Unit(sources=sources, outputs=outputs, rebuild=rebuild)


def _gqa_unit(module: str, spec: dict, ranks: RankShapes, params: dict, tp: int) -> Unit | None:
    if spec.get("bias"):
        raise CheckpointError(f"{module}: GQA qkv projections with bias are not supported")
    qkv = f"{module}.{spec['gqa_qkv_projection_name']}"
    names = {p: f"{module}.{spec[p + '_projection_name']}.weight" for p in ("query", "key", "value", "output")}
    fused = spec["fuse_qkv"]
    qkv_sources = [f"{qkv}.weight_qkv"] if fused else [f"{qkv}.weight_{x}" for x in "qkv"]
    if not all(s in ranks.shapes for s in qkv_sources):
        return None
    heads, kv_heads, copies = spec["num_attention_heads"], spec["num_key_value_heads"], spec["kv_size_multiplier"]
    order = query_head_order(tp, heads, kv_heads, copies)
    q_rows, kv_rows = spec["q_output_size_per_partition"], spec["kv_output_size_per_partition"]
    hidden = ranks.shapes[qkv_sources[0]][1]
    per_rank = {"query": q_rows, "key": kv_rows, "value": kv_rows}
    fused_rows = q_rows + 2 * kv_rows
    for source in qkv_sources:
        rows = ranks.shapes[source][0]
        expected = fused_rows if fused else per_rank[{"q": "query", "k": "key", "v": "value"}[source[-1]]]
        if rows != expected:
            raise CheckpointError(f"{source} has {rows} rows per rank; the GQA spec implies {expected}")
    o_dim = params.get(names["output"], {}).get("partition_dim", 1)
    o_piece = ranks.shapes[names["output"]]
    dtype = ranks.dtypes[qkv_sources[0]]
    outputs = [
        OutputTensor(names["query"], (q_rows * tp, hidden), dtype),
        OutputTensor(names["key"], (kv_rows * tp // copies, hidden), dtype),
        OutputTensor(names["value"], (kv_rows * tp // copies, hidden), dtype),
        OutputTensor(names["output"], _scaled(o_piece, o_dim, tp), ranks.dtypes[names["output"]]),
    ]

    def rebuild(pieces: Pieces) -> dict[str, Blocks]:
        if fused:
            split = [p.split([q_rows, kv_rows, kv_rows]) for p in pieces[qkv_sources[0]]]
            q, k, v = ([s[i] for s in split] for i in range(3))
        else:
            q, k, v = (pieces[s] for s in qkv_sources)
        head_rows = [head for piece in q for head in piece.split(q_rows * tp // heads)]
        position = {head: p for p, head in enumerate(order)}
        return {
            names["query"]: [head_rows[position[head]] for head in range(heads)],
            names["key"]: [one_kv_copy(torch.cat(k), copies, names["key"])],
            names["value"]: [one_kv_copy(torch.cat(v), copies, names["value"])],
            names["output"]: [restore_head_order(torch.cat(pieces[names["output"]], o_dim), order, o_dim)],
        }

    return Unit(sources=[*qkv_sources, names["output"]], outputs=outputs, rebuild=rebuild)


SPEC_UNITS: dict[str, Callable[[str, dict, RankShapes, dict, int], Unit | None]] = {
    "FusedLinearsSpec": _fused_unit,
    "GQAQKVColumnParallelLinearSpec": _gqa_unit,
}


def join_blocks(parts: list[torch.Tensor], dim: int) -> Blocks:
    """Concatenation along ``dim``: the parts themselves along rows, one built tensor along columns."""
    return list(parts) if dim == 0 else [torch.cat(parts, dim)]


def _replicated(name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    drift = max((float((p.float() - pieces[0].float()).abs().max()) for p in pieces[1:]), default=0.0)
    if drift > 0:
        print(f"note: {name} differs across TP ranks by up to {drift:.3g}; keeping TP rank 0's copy", flush=True)
    return pieces[0]


def _plain_unit(name: str, info: dict, ranks: RankShapes, tp: int) -> Unit:
    split = bool(info.get("tensor_model_parallel"))
    shape = _scaled(ranks.shapes[name], info["partition_dim"], tp) if split else ranks.shapes[name]

    def rebuild(pieces: Pieces) -> dict[str, Blocks]:
        if not split:
            return {name: [_replicated(name, pieces[name])]}
        if any(p.shape != pieces[name][0].shape for p in pieces[name]):
            raise CheckpointError(f"{name} has different shapes on different TP ranks")
        if info["partition_dim"] != 0:
            return {name: [join_shards(name, pieces[name], info)]}
        stride = info.get("partition_stride") or 1
        if pieces[name][0].shape[0] % stride:
            raise CheckpointError(f"{name}: {pieces[name][0].shape[0]} rows per rank do not split into stride {stride}")
        blocks = [p.split(p.shape[0] // stride) for p in pieces[name]]
        return {name: [blocks[rank][s] for s in range(stride) for rank in range(len(blocks))]}

    return Unit(sources=[name], outputs=[OutputTensor(name, shape, ranks.dtypes[name])], rebuild=rebuild)


def plan_stage(metadata: dict, ranks: RankShapes, tp: int, source: str) -> list[Unit]:
    """The units of one pipeline stage, in no particular order; errors name ``source`` (the metadata file)."""
    try:
        return _plan(metadata, ranks, tp)
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: malformed metadata ({type(exc).__name__}: {exc})") from None


def _plan(metadata: dict, ranks: RankShapes, tp: int) -> list[Unit]:
    params: dict = metadata["parameters"]
    lora = sorted(name for name in (*params, *ranks.shapes) if ".lora_" in name)
    if lora:
        raise CheckpointError(f"{lora[0]} is a LoRA tensor: this is an adapter, not a full-model checkpoint")
    check_partition_counts(params, [name for name in params if name in ranks.shapes], tp)
    units: list[Unit] = []
    for module, spec, build in transformation_specs(metadata, SPEC_UNITS, tp):
        if spec.get("peft_type") is not None:
            raise CheckpointError(f"the spec for {module} is a LoRA spec (peft_type {spec['peft_type']})")
        unit = build(module, spec, ranks, params, tp)
        if unit is not None:
            units.append(unit)
    consumed = {source for unit in units for source in unit.sources}
    for name in sorted(set(ranks.shapes) - consumed):
        if name not in params:
            print(f"note: {name} is not a parameter in the metadata (a buffer?); keeping TP rank 0's copy", flush=True)
        units.append(_plain_unit(name, params.get(name, {"tensor_model_parallel": False}), ranks, tp))
    produced: dict[str, str] = {}
    for unit in units:
        for output in unit.outputs:
            if output.name in produced:
                raise CheckpointError(f"{output.name} is produced twice (two specs or a spec and a plain tensor)")
            produced[output.name] = output.name
    return units


def hf_order(units: list[Unit]) -> list[Unit]:
    """Embeddings, then layers in numeric order, then the final norm and lm_head (how HF lists them)."""
    return sorted(units, key=lambda unit: (unit.layer, unit.outputs[0].name))
