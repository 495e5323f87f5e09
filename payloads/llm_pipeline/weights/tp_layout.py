"""Rebuild full LoRA tensors from tensor-parallel shards, as described by neuronx-distributed metadata.

``mp_metadata_pp_rank_<p>.json`` describes every parameter (``tensor_model_parallel``,
``partition_dim``, ``partition_stride``, ``num_partitions``; names carry the adapter name, e.g.
``.lora_A.default.weight``; the rank files' names do not) and lists the transformation specs that
map optimum-neuron's fused layers back to Hugging Face ones:

- FusedLinearsSpec (``gate_up_proj`` = gate then up): each rank's lora_B holds its slice of gate
  followed by its slice of up; the shared lora_A becomes both modules' lora_A.
- GQAQKVColumnParallelLinearSpec (``qkv_proj``, used when TP exceeds the KV heads): one shared
  lora_A for q/k/v; k/v lora_B repeated ``kv_size_multiplier`` times before splitting (keep one
  copy); q lora_B rows and o_proj lora_A columns are grouped per rank by KV head (undo the order).

Everything else is column-split (concatenate on ``partition_dim``, interleaving ``partition_stride``
blocks) or replicated (every rank holds it whole; the copies must agree within one bf16 step, see
``replicated_copy``). A spec whose tensors are
absent (modules the adapter does not target) is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from llm_pipeline.errors import CheckpointError

_ADAPTER_IN_NAME = re.compile(
    r"^(?P<head>.+\.(?:lora_(?:embedding_)?[AB]|lora_magnitude_vector))\.(?P<adapter>[^.]+)(?P<tail>(?:\..+)?)$"
)
Ranks = list[dict[str, torch.Tensor]]
Rebuilt = tuple[dict[str, torch.Tensor], set[str]]  # full tensors, rank-file names consumed


@dataclass
class StageShards:
    """One pipeline stage: its metadata and the ``{name: tensor}`` dict of each TP rank, in rank order."""

    metadata: dict
    ranks: Ranks
    source: str  # the metadata file, for messages


def name_without_adapter(name: str, adapter: str) -> str | None:
    """``x.lora_A.default.weight`` -> ``x.lora_A.weight``; None for another adapter's parameter."""
    match = _ADAPTER_IN_NAME.match(name)
    if match is None:
        return name
    return match["head"] + match["tail"] if match["adapter"] == adapter else None


def query_head_order(tp: int, heads: int, kv_heads: int, kv_multiplier: int) -> list[int]:
    """Position p of the rank-concatenated q rows holds original query head ``order[p]``.

    The KV heads, repeated kv_multiplier times (0..K-1, 0..K-1, ...), are dealt to the ranks in
    order; copy c of KV head h serves the c-th equal share of h's query group.
    """
    slots = kv_heads * kv_multiplier
    if heads % tp or slots % tp or heads % slots:
        raise CheckpointError(
            f"GQA layout with {heads} heads, {kv_heads} KV heads x{kv_multiplier} cannot split over TP={tp}"
        )
    per_slot, group = heads // slots, heads // kv_heads
    order = []
    for slot in range(slots):
        first = (slot % kv_heads) * group + (slot // kv_heads) * per_slot
        order.extend(range(first, first + per_slot))
    if sorted(order) != list(range(heads)):
        raise CheckpointError(
            f"GQA layout with {heads} heads, {kv_heads} KV heads x{kv_multiplier} is not a permutation"
        )
    return order


def restore_head_order(full: torch.Tensor, order: list[int], dim: int) -> torch.Tensor:
    rows = full.movedim(dim, 0)
    if rows.shape[0] % len(order):
        raise CheckpointError(f"a {list(full.shape)} tensor cannot hold {len(order)} heads on dim {dim}")
    heads = rows.reshape(len(order), -1, *rows.shape[1:])
    restored = torch.empty_like(heads)
    restored[torch.tensor(order)] = heads
    return restored.reshape(rows.shape).movedim(0, dim).contiguous()


def one_kv_copy(full: torch.Tensor, copies: int, name: str) -> torch.Tensor:
    if full.shape[0] % copies:
        raise CheckpointError(f"{name}: {full.shape[0]} rows cannot hold {copies} KV copies")
    parts = full.split(full.shape[0] // copies)
    drift = max((float((p.float() - parts[0].float()).abs().max()) for p in parts[1:]), default=0.0)
    if drift > 0:
        print(f"note: {name}: the {copies} KV-head copies differ by up to {drift:.3g}; keeping the first", flush=True)
    return parts[0].clone()


# Replicated copies may differ by one bf16 step: bf16 keeps 8 significant bits, so neighbouring values
# are at most 2**-7 of their magnitude apart. Stochastic rounding (on by default on Trainium) and
# per-rank dropout masks can leave such last-bit differences between ranks that saw the same data.
REPLICA_RELATIVE_TOLERANCE = 2.0**-7
REPLICA_ABSOLUTE_FLOOR = 1e-30  # two zeros, or values below bf16's normal range, count as equal


def _beyond_one_step(piece: torch.Tensor, reference: torch.Tensor) -> bool:
    a, b = piece.float(), reference.float()
    allowed = REPLICA_RELATIVE_TOLERANCE * torch.maximum(a.abs(), b.abs()) + REPLICA_ABSOLUTE_FLOOR
    return bool(((a - b).abs() > allowed).any())


def replicated_copy(name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The value of a tensor every TP rank holds whole: TP rank 0's copy, when every copy agrees with it.

    Agreement is within REPLICA_RELATIVE_TOLERANCE elementwise (one bf16 step), and any difference
    within it is logged. Beyond it the checkpoint is refused: replicated LoRA factors get the same
    gradients on every rank only without sequence parallelism, so copies that drifted apart mean each
    rank trained its own copy, and no single copy is the trained adapter.
    """
    reference = pieces[0]
    drifts = {rank: float((piece.float() - reference.float()).abs().max()) for rank, piece in enumerate(pieces)}
    beyond = [rank for rank, piece in enumerate(pieces[1:], 1) if _beyond_one_step(piece, reference)]
    if beyond:
        shown = ", ".join(str(rank) for rank in beyond[:8]) + (" ..." if len(beyond) > 8 else "")
        raise CheckpointError(
            f"{name} is replicated over the {len(pieces)} TP ranks, but the copies on TP rank(s) {shown} differ "
            f"from TP rank 0's by up to {max(drifts[rank] for rank in beyond):.3g}, more than one bf16 step "
            f"(relative {REPLICA_RELATIVE_TOLERANCE:.3g}): each rank trained its own copy (sequence parallelism was "
            "on for a LoRA run), so no copy is the trained adapter; retrain with the neuron backend as it is now "
            "(sequence parallelism off for LoRA)"
        )
    drift = max(drifts.values())
    if drift > 0:
        print(
            f"note: {name}: the {len(pieces)} TP ranks' copies differ by up to {drift:.3g} (within one bf16 step); "
            "keeping TP rank 0's",
            flush=True,
        )
    return reference


def _need_all(keys: list[str], ranks: Ranks) -> bool:
    present = [k for k in keys if k in ranks[0]]
    if present and len(present) != len(keys):
        missing = sorted(set(keys) - set(present))
        raise CheckpointError(f"rank files hold {present[0]} but not {missing[0]}")
    return bool(present)


def _fused_linears(module: str, spec: dict, ranks: Ranks, params: dict, tp: int) -> Rebuilt:
    fused = f"{module}.{spec['fused_linear_name']}"
    a_key, b_key = f"{fused}.lora_A.weight", f"{fused}.lora_B.weight"
    if not _need_all([a_key, b_key], ranks):
        return {}, set()
    if spec["fuse_axis"] not in (0, "column") or f"{fused}.lora_B.bias" in ranks[0]:
        raise CheckpointError(f"{fused}: only column-fused layers without LoRA bias are supported")
    sizes = [dim // tp for dim in spec["original_dims"]]
    for rank, tensors in enumerate(ranks):
        if tensors[b_key].shape[0] != sum(sizes):
            raise CheckpointError(
                f"{b_key} on TP rank {rank} has {tensors[b_key].shape[0]} rows; the spec implies {sum(sizes)}"
            )
    parts = [tensors[b_key].split(sizes) for tensors in ranks]
    shared_a = replicated_copy(a_key, [tensors[a_key] for tensors in ranks])
    rebuilt = {}
    for index, linear in enumerate(spec["linear_names"]):
        rebuilt[f"{module}.{linear}.lora_B.weight"] = torch.cat([p[index] for p in parts])
        rebuilt[f"{module}.{linear}.lora_A.weight"] = shared_a.clone()
    return rebuilt, {a_key, b_key}


def _gqa_qkv(module: str, spec: dict, ranks: Ranks, params: dict, tp: int) -> Rebuilt:
    qkv = f"{module}.{spec['gqa_qkv_projection_name']}"
    proj = {p: f"{module}.{spec[p + '_projection_name']}" for p in ("query", "key", "value", "output")}
    order = query_head_order(tp, spec["num_attention_heads"], spec["num_key_value_heads"], spec["kv_size_multiplier"])
    q_rows, kv_rows = spec["q_output_size_per_partition"], spec["kv_output_size_per_partition"]
    a_key = f"{qkv}.lora_A.weight"
    b_keys = [f"{qkv}.lora_B.weight_qkv"] if spec["fuse_qkv"] else [f"{qkv}.lora_B.weight_{x}" for x in "qkv"]
    rebuilt: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    if _need_all([a_key, *b_keys], ranks):
        pieces: dict[str, list[torch.Tensor]] = {"query": [], "key": [], "value": []}
        for rank, tensors in enumerate(ranks):
            if spec["fuse_qkv"]:
                fused = tensors[b_keys[0]]
                split = (fused[:q_rows], fused[q_rows : q_rows + kv_rows], fused[q_rows + kv_rows :])
            else:
                split = tuple(tensors[key] for key in b_keys)
            for part, tensor, rows in zip(pieces, split, (q_rows, kv_rows, kv_rows), strict=True):
                if tensor.shape[0] != rows:
                    raise CheckpointError(
                        f"{qkv} {part} lora_B on TP rank {rank} has {tensor.shape[0]} rows; the spec implies {rows}"
                    )
                pieces[part].append(tensor)
        shared_a = replicated_copy(a_key, [tensors[a_key] for tensors in ranks])
        full = {
            "query": restore_head_order(torch.cat(pieces["query"]), order, 0),
            "key": one_kv_copy(torch.cat(pieces["key"]), spec["kv_size_multiplier"], f"{proj['key']}.lora_B"),
            "value": one_kv_copy(torch.cat(pieces["value"]), spec["kv_size_multiplier"], f"{proj['value']}.lora_B"),
        }
        for part, tensor in full.items():
            rebuilt[f"{proj[part]}.lora_B.weight"] = tensor
            rebuilt[f"{proj[part]}.lora_A.weight"] = shared_a.clone()
        used |= {a_key, *b_keys}
    o_key = f"{proj['output']}.lora_A.weight"
    if o_key in ranks[0]:
        dim = params.get(o_key, {}).get("partition_dim", 1)
        rebuilt[o_key] = restore_head_order(torch.cat([t[o_key] for t in ranks], dim), order, dim)
        used.add(o_key)
    return rebuilt, used


SPEC_HANDLERS: dict[str, Callable[[str, dict, Ranks, dict, int], Rebuilt]] = {
    "FusedLinearsSpec": _fused_linears,
    "GQAQKVColumnParallelLinearSpec": _gqa_qkv,
}


def join_shards(name: str, pieces: list[torch.Tensor], info: dict) -> torch.Tensor:
    """Concatenate a split tensor (interleaving stride blocks) or take one copy of a replicated one."""
    if any(p.shape != pieces[0].shape for p in pieces):
        raise CheckpointError(f"{name} has different shapes on different TP ranks: {[list(p.shape) for p in pieces]}")
    if not info.get("tensor_model_parallel"):
        return replicated_copy(name, pieces)
    dim, stride = info["partition_dim"], info.get("partition_stride") or 1
    if pieces[0].shape[dim] % stride:
        raise CheckpointError(
            f"{name}: {pieces[0].shape[dim]} elements per rank on dim {dim} do not split into stride {stride}"
        )
    blocks = [p.split(p.shape[dim] // stride, dim) for p in pieces]
    return torch.cat([blocks[rank][s] for s in range(stride) for rank in range(len(pieces))], dim)


Handler = TypeVar("Handler")  # what a caller does with one spec class (rebuild tensors, plan units)


def check_partition_counts(params: dict, names: Iterable[str], tp: int) -> None:
    """Every tensor in ``names`` that the metadata marks tensor-parallel is split in ``tp`` parts."""
    for name in names:
        info = params[name]
        parts = info.get("num_partitions", tp) if info.get("tensor_model_parallel") else tp
        if parts != tp:
            raise CheckpointError(f"the metadata splits {name} in {parts} parts but there are {tp} TP rank files")


def transformation_specs(metadata: dict, known: Mapping[str, Handler], tp: int) -> Iterator[tuple[str, dict, Handler]]:
    """(module, spec, its handler) for every transformation spec, refusing an unknown class or another TP size."""
    for group in metadata.get("model_weight_transformation_specs", []):
        module = group["module_fully_qualified_name"]
        for class_name, spec in group["specs"]:
            handler = known.get(class_name)
            if handler is None:
                raise CheckpointError(f"unknown transformation spec {class_name} (written by a newer optimum-neuron?)")
            if spec.get("tp_size", tp) != tp:
                raise CheckpointError(f"{class_name} for {module} says TP={spec['tp_size']}, files say TP={tp}")
            yield module, spec, handler


def consolidate_stage(stage: StageShards, adapter: str = "default") -> dict[str, torch.Tensor]:
    """Full tensors of one pipeline stage, keyed like the rank files (no adapter name)."""
    try:
        return _consolidate(stage.metadata, stage.ranks, adapter)
    except CheckpointError as exc:
        raise CheckpointError(f"{stage.source}: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{stage.source}: malformed metadata ({type(exc).__name__}: {exc})") from None


def _consolidate(metadata: dict, ranks: Ranks, adapter: str) -> dict[str, torch.Tensor]:
    tp = len(ranks)
    params = {}
    for name, info in metadata["parameters"].items():
        plain = name_without_adapter(name, adapter)
        if plain is not None:
            params[plain] = info
    saved = set(ranks[0])
    for rank, tensors in enumerate(ranks[1:], 1):
        if set(tensors) != saved:
            extra = sorted(set(tensors) ^ saved)
            raise CheckpointError(f"TP rank {rank} and TP rank 0 hold different tensors (e.g. {extra[0]})")
    undescribed = sorted(saved - set(params))
    if undescribed:
        raise CheckpointError(f"the rank files hold {undescribed[0]}, which the metadata does not describe")
    check_partition_counts(params, saved, tp)
    rebuilt: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    for module, spec, handler in transformation_specs(metadata, SPEC_HANDLERS, tp):
        tensors, used = handler(module, spec, ranks, params, tp)
        _add(rebuilt, tensors)
        consumed |= used
    _add(
        rebuilt, {name: join_shards(name, [t[name] for t in ranks], params[name]) for name in sorted(saved - consumed)}
    )
    return rebuilt


def _add(into: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
    for name, tensor in tensors.items():
        if name in into:
            raise CheckpointError(f"{name} is produced twice (two specs or a spec and a plain tensor)")
        into[name] = tensor
