"""Test helpers for consolidate/merge: full LoRA adapters, and how optimum-neuron 0.4.x /
neuronx-distributed split them over tensor-parallel ranks (nxd_files writes them to disk).

The writer follows the split table in the neuron training facts (column-parallel lora_B split on
rows, row-parallel lora_A split on columns, replicated factors whole on every rank, gate_up fused
per rank with gate's slice then up's, GQA: shared q/k/v lora_A, k/v repeated kv_multiplier times
then split, q rows and o columns grouped per rank by KV head). test_consolidate_contract checks its
per-rank tensors against the splitting functions of the installed optimum-neuron.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

P = "base_model.model."
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Shape:
    hidden: int = 64
    heads: int = 8
    kv_heads: int = 8
    intermediate: int = 128
    layers: int = 2
    vocab: int = 96

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_dims(self, module: str) -> tuple[int, int]:
        """(out_features, in_features) of a Llama linear module."""
        kv = self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, self.hidden),
            "k_proj": (kv, self.hidden),
            "v_proj": (kv, self.hidden),
            "o_proj": (self.hidden, self.hidden),
            "gate_proj": (self.intermediate, self.hidden),
            "up_proj": (self.intermediate, self.hidden),
            "down_proj": (self.hidden, self.intermediate),
            "lm_head": (self.vocab, self.hidden),
        }[module]


def module_path(module: str, layer: int) -> str:
    if module == "lm_head":
        return "lm_head"
    group = "self_attn" if module in ATTENTION else "mlp"
    return f"model.layers.{layer}.{group}.{module}"


def full_adapter(
    shape: Shape, targets: tuple[str, ...], r: int = 4, seed: int = 0, *, share_a: bool = True
) -> dict[str, torch.Tensor]:
    """A peft-format adapter with random non-zero factors. With share_a, modules optimum-neuron fuses
    (gate/up, and q/k/v) share one lora_A, as any adapter trained on Neuron does."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(shape.layers):
        shared: dict[str, torch.Tensor] = {}
        for module in (*ATTENTION, *MLP):
            if module not in targets:
                continue
            out_f, in_f = shape.linear_dims(module)
            group = (
                "qkv"
                if module in ("q_proj", "k_proj", "v_proj")
                else "gate_up"
                if module in ("gate_proj", "up_proj")
                else module
            )
            a = (
                shared.setdefault(group, torch.randn(r, in_f, generator=g))
                if share_a
                else torch.randn(r, in_f, generator=g)
            )
            key = P + module_path(module, layer)
            tensors[f"{key}.lora_A.weight"] = a.clone()
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, r, generator=g)
    if "lm_head" in targets:
        tensors[f"{P}lm_head.lora_A.weight"] = torch.randn(r, shape.hidden, generator=g)
        tensors[f"{P}lm_head.lora_B.weight"] = torch.randn(shape.vocab, r, generator=g)
        tensors[f"{P}lm_head.base_layer.weight"] = torch.randn(shape.vocab, shape.hidden, generator=g)
    if "embed_tokens" in targets:
        tensors[f"{P}model.embed_tokens.lora_embedding_A"] = torch.randn(r, shape.vocab, generator=g)
        tensors[f"{P}model.embed_tokens.lora_embedding_B"] = torch.randn(shape.hidden, r, generator=g)
        tensors[f"{P}model.embed_tokens.base_layer.weight"] = torch.randn(shape.vocab, shape.hidden, generator=g)
    return tensors


def adapter_config(targets: tuple[str, ...], r: int = 4, alpha: int = 8, rslora: bool = False) -> dict:
    from peft import LoraConfig

    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora, task_type="CAUSAL_LM")
    return json.loads(json.dumps(config.to_dict(), default=sorted))


def uses_gqa_layout(shape: Shape, tp: int) -> bool:
    """optimum-neuron's Llama switches to its GQA qkv layer when KV heads cannot be split evenly."""
    return shape.kv_heads < tp or shape.kv_heads % tp != 0


def query_heads_on_rank(rank: int, tp: int, heads: int, kv_heads: int, multiplier: int) -> list[int]:
    """Query heads held by one rank: the repeated KV heads [0..K-1]*multiplier are dealt to the ranks
    in order, and copy c of KV head h serves the c-th share of h's query group."""
    kv_per_rank, share = kv_heads * multiplier // tp, heads // (kv_heads * multiplier)
    held = []
    for slot in range(rank * kv_per_rank, (rank + 1) * kv_per_rank):
        kv_head, copy = slot % kv_heads, slot // kv_heads
        start = kv_head * (heads // kv_heads) + copy * share
        held.extend(range(start, start + share))
    return held


def _rows_of_heads(weight: torch.Tensor, heads: list[int], head_dim: int, dim: int) -> torch.Tensor:
    index = torch.tensor([h * head_dim + i for h in heads for i in range(head_dim)])
    return weight.index_select(dim, index)


def _with_adapter(name: str, adapter: str) -> str:
    for part in (".lora_A", ".lora_B", ".lora_embedding_A", ".lora_embedding_B"):
        if part + "." in name or name.endswith(part):
            return name.replace(part, f"{part}.{adapter}", 1)
    return name


class _Sharder:
    """Collects per-rank tensors and their metadata entries."""

    def __init__(self, tp: int, adapter: str) -> None:
        self.tp, self.adapter = tp, adapter
        self.ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
        self.params: dict[str, dict] = {}

    def split(self, dim: int, stride: int = 1) -> dict:
        return {
            "tensor_model_parallel": True,
            "partition_dim": dim,
            "partition_stride": stride,
            "num_partitions": self.tp,
        }

    def describe(self, name: str, meta: dict) -> None:
        self.params[_with_adapter(name, self.adapter)] = meta

    def put(self, name: str, pieces: list[torch.Tensor], meta: dict) -> None:
        for rank, piece in enumerate(pieces):
            self.ranks[rank][name] = piece.clone().contiguous()
        self.describe(name, meta)

    def replicated(self, name: str, tensor: torch.Tensor) -> None:
        self.put(name, [tensor] * self.tp, {"tensor_model_parallel": False})

    def column(self, name: str, tensor: torch.Tensor) -> None:
        self.put(name, list(tensor.chunk(self.tp, 0)), self.split(0))

    def row(self, name: str, tensor: torch.Tensor, pieces: list[torch.Tensor] | None = None) -> None:
        self.put(name, pieces or list(tensor.chunk(self.tp, 1)), self.split(1))


def _shared_a(adapter: dict, keys: list[str]) -> torch.Tensor:
    first = adapter[keys[0]]
    if any(not torch.equal(adapter[k], first) for k in keys[1:]):
        raise ValueError(f"{keys} differ: a Neuron-trained adapter shares one lora_A for fused modules")
    return first


def shard_adapter(
    shape: Shape, adapter: dict[str, torch.Tensor], tp: int, *, fuse_qkv: bool = False, adapter_name: str = "default"
):
    """(per-rank {name: tensor} dicts, mp_metadata dict) as optimum-neuron saves them at this TP size."""
    s = _Sharder(tp, adapter_name)
    gqa = uses_gqa_layout(shape, tp)
    multiplier = max(1, tp // shape.kv_heads) if gqa else 1
    specs = []
    for layer in range(shape.layers):
        attn, mlp = f"{P}model.layers.{layer}.self_attn", f"{P}model.layers.{layer}.mlp"

        def lora(module: str, f: str, layer: int = layer) -> str:
            return f"{P}{module_path(module, layer)}.lora_{f}.weight"

        targeted = {m for m in (*ATTENTION, *MLP) if lora(m, "A") in adapter}
        heads_on = [query_heads_on_rank(r, tp, shape.heads, shape.kv_heads, multiplier) for r in range(tp)]
        if gqa:
            qkv = f"{attn}.qkv_proj"
            base = f"{qkv}.base_layer" if "q_proj" in targeted else qkv
            for part in ("q", "k", "v"):
                s.describe(f"{base}.weight_{part}", s.split(0))
            if "q_proj" in targeted:
                s.replicated(
                    f"{qkv}.lora_A.weight", _shared_a(adapter, [lora(m, "A") for m in ("q_proj", "k_proj", "v_proj")])
                )
                q = [_rows_of_heads(adapter[lora("q_proj", "B")], heads_on[r], shape.head_dim, 0) for r in range(tp)]
                k, v = (list(adapter[lora(m, "B")].repeat(multiplier, 1).chunk(tp)) for m in ("k_proj", "v_proj"))
                if fuse_qkv:  # neuronx-distributed sets no TP attributes on weight_qkv
                    s.put(
                        f"{qkv}.lora_B.weight_qkv",
                        [torch.cat(t) for t in zip(q, k, v, strict=True)],
                        {"tensor_model_parallel": False},
                    )
                else:
                    for part, pieces in zip("qkv", (q, k, v), strict=True):
                        s.put(f"{qkv}.lora_B.weight_{part}", pieces, s.split(0))
            fields = {
                "gqa_qkv_projection_name": "qkv_proj",
                "query_projection_name": "q_proj",
                "key_projection_name": "k_proj",
                "value_projection_name": "v_proj",
                "output_projection_name": "o_proj",
                "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.kv_heads,
                "kv_size_multiplier": multiplier,
                "q_output_size_per_partition": shape.hidden // tp,
                "kv_output_size_per_partition": shape.kv_heads * multiplier * shape.head_dim // tp,
                "fuse_qkv": fuse_qkv,
                "bias": False,
                "tp_size": tp,
                "peft_type": "lora" if "q_proj" in targeted else None,
            }
            specs.append({"module_fully_qualified_name": attn, "specs": [["GQAQKVColumnParallelLinearSpec", fields]]})
        else:
            for module in ("q_proj", "k_proj", "v_proj"):
                key = f"{attn}.{module}"
                s.describe(f"{key}.base_layer.weight" if module in targeted else f"{key}.weight", s.split(0))
                if module in targeted:
                    s.replicated(lora(module, "A"), adapter[lora(module, "A")])
                    s.column(lora(module, "B"), adapter[lora(module, "B")])
            specs.append({"module_fully_qualified_name": attn, "specs": []})
        for module in ("o_proj", "down_proj"):
            key = f"{P}{module_path(module, layer)}"
            s.describe(f"{key}.base_layer.weight" if module in targeted else f"{key}.weight", s.split(1))
            if module in targeted:
                a = adapter[lora(module, "A")]
                permuted = (
                    [_rows_of_heads(a, heads_on[r], shape.head_dim, 1) for r in range(tp)]
                    if gqa and module == "o_proj"
                    else None
                )
                s.row(lora(module, "A"), a, permuted)
                s.replicated(lora(module, "B"), adapter[lora(module, "B")])
        gate_up = f"{mlp}.gate_up_proj"
        s.describe(
            f"{gate_up}.base_layer.weight" if "gate_proj" in targeted else f"{gate_up}.weight", s.split(0, stride=2)
        )
        if "gate_proj" in targeted:
            s.replicated(f"{gate_up}.lora_A.weight", _shared_a(adapter, [lora("gate_proj", "A"), lora("up_proj", "A")]))
            gate, up = (adapter[lora(m, "B")].chunk(tp) for m in ("gate_proj", "up_proj"))
            s.put(f"{gate_up}.lora_B.weight", [torch.cat(pair) for pair in zip(gate, up, strict=True)], s.split(0))
        fused = {
            "fused_linear_name": "gate_up_proj",
            "linear_names": ["gate_proj", "up_proj"],
            "bias": False,
            "fuse_axis": 0,
            "original_dims": [shape.intermediate] * 2,
            "tp_size": tp,
            "peft_type": "lora" if "gate_proj" in targeted else None,
        }
        specs.append({"module_fully_qualified_name": mlp, "specs": [["FusedLinearsSpec", fused]]})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            s.describe(f"{P}model.layers.{layer}.{norm}.weight", {"tensor_model_parallel": False})
    embed, head = f"{P}model.embed_tokens", f"{P}lm_head"
    s.describe(
        f"{embed}.base_layer.weight" if f"{embed}.lora_embedding_A" in adapter else f"{embed}.weight", s.split(0)
    )
    if f"{embed}.lora_embedding_A" in adapter:
        s.replicated(f"{embed}.lora_embedding_A", adapter[f"{embed}.lora_embedding_A"])
        s.replicated(f"{embed}.lora_embedding_B", adapter[f"{embed}.lora_embedding_B"])
        s.column(f"{embed}.base_layer.weight", adapter[f"{embed}.base_layer.weight"])
    s.describe(f"{head}.base_layer.weight" if f"{head}.lora_A.weight" in adapter else f"{head}.weight", s.split(0))
    if f"{head}.lora_A.weight" in adapter:
        s.replicated(f"{head}.lora_A.weight", adapter[f"{head}.lora_A.weight"])
        s.column(f"{head}.lora_B.weight", adapter[f"{head}.lora_B.weight"])
        s.column(f"{head}.base_layer.weight", adapter[f"{head}.base_layer.weight"])
    s.describe(f"{P}model.norm.weight", {"tensor_model_parallel": False})
    return s.ranks, {"parameters": s.params, "model_weight_transformation_specs": specs}
