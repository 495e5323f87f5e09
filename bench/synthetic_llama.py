"""Synthetic Llama-shaped checkpoints: Hub names, shapes and sharding, random values, written at disk speed.

Used by the benchmarks (tiny, 1B-class and 8B shapes) and by tests that need a model too large to
build with transformers quickly. Values come from one small random block, tiled, so writing costs
what the disk costs; the layout (names, shapes, dtype, shards of at most 5 GB with an index) is the
real one, split with huggingface_hub's shard helper.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

DTYPE_CODES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # tie_word_embeddings: no lm_head.weight of its own

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SMOKE_SHAPE = "tiny"  # process start-up outweighs its work: its times prove the script runs, no target applies
SHAPES = {
    # tiny: seconds per benchmark (the test suite's smoke runs; the training benchmark's CPU default).
    # 8 query heads, 2 KV heads: valid at TP 8 (one query head per rank, KV heads replicated).
    "tiny": LlamaShape(hidden=128, intermediate=352, layers=2, heads=8, kv_heads=2, vocab=2048, tied=False),
    "1b": LlamaShape(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, vocab=128256, tied=True),
    "8b": LlamaShape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, tied=False),
}


def tensor_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of LlamaForCausalLM with this shape, in the Hub's naming."""
    kv = shape.kv_heads * shape.head_dim
    tensors: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab, shape.hidden)}
    for i in range(shape.layers):
        prefix = f"model.layers.{i}"
        tensors |= {
            f"{prefix}.self_attn.q_proj.weight": (shape.hidden, shape.hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv, shape.hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv, shape.hidden),
            f"{prefix}.self_attn.o_proj.weight": (shape.hidden, shape.hidden),
            f"{prefix}.mlp.gate_proj.weight": (shape.intermediate, shape.hidden),
            f"{prefix}.mlp.up_proj.weight": (shape.intermediate, shape.hidden),
            f"{prefix}.mlp.down_proj.weight": (shape.hidden, shape.intermediate),
            f"{prefix}.input_layernorm.weight": (shape.hidden,),
            f"{prefix}.post_attention_layernorm.weight": (shape.hidden,),
        }
    tensors["model.norm.weight"] = (shape.hidden,)
    if not shape.tied:
        tensors["lm_head.weight"] = (shape.vocab, shape.hidden)
    return tensors


def _random_block(dtype: str, nbytes: int, seed: int) -> bytes:
    import torch

    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(nbytes // DTYPE_CODES[dtype][1], generator=generator) * 0.02
    return values.to(getattr(torch, dtype)).view(torch.uint8).numpy().tobytes()


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str, block: bytes) -> int:
    """Write one file in the safetensors format with tiled random data; returns its size."""
    code, itemsize = DTYPE_CODES[dtype]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dims in shapes.items():
        size = math.prod(dims) * itemsize
        header[name] = {"dtype": code, "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data start to 8 bytes
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        remaining = offset
        while remaining:
            chunk = block[: min(remaining, len(block))]
            out.write(chunk)
            remaining -= len(chunk)
    return 8 + len(text) + offset


def write_model(
    folder: Path, shape: LlamaShape, *, dtype: str = "bfloat16", max_shard_size: int | str = "5GB", seed: int = 0
) -> Path:
    """A complete model folder (config, generation config, tokenizer, shards, index) for ``shape``."""
    from huggingface_hub import split_state_dict_into_shards_factory

    folder.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(shape)
    itemsize = DTYPE_CODES[dtype][1]
    split = split_state_dict_into_shards_factory(
        shapes,
        get_storage_size=lambda dims: math.prod(dims) * itemsize,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size=max_shard_size,
    )
    block = _random_block(dtype, 64 * 1024 * 1024, seed)
    for filename, names in split.filename_to_tensors.items():
        write_safetensors(folder / filename, {name: shapes[name] for name in names}, dtype, block)
    if split.is_sharded:
        index = {"metadata": {"total_size": split.metadata["total_size"]}, "weight_map": split.tensor_to_filename}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    write_side_files(folder, shape, dtype)
    return folder


def hf_config(shape: LlamaShape, dtype: str):
    """The transformers LlamaConfig of ``shape`` (8192 positions, as Llama 3 has)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=8192,
        torch_dtype=dtype,
        architectures=["LlamaForCausalLM"],
    )


def write_side_files(folder: Path, shape: LlamaShape, dtype: str) -> None:
    """config.json, generation_config.json and a (tiny) tokenizer, as a model folder has them."""
    from transformers import GenerationConfig

    from tools import tiny_model as tiny

    hf_config(shape, dtype).save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(folder)
    tiny.build_tokenizer().save_pretrained(folder)


def write_adapter(
    folder: Path,
    shape: LlamaShape,
    *,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    r: int = 16,
    alpha: int = 16,
    seed: int = 0,
) -> Path:
    """A peft LoRA adapter for ``shape`` with random (non-zero) A and B, saved as peft saves it."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, dims in tensor_shapes(shape).items():
        module = name.removesuffix(".weight")
        if len(dims) != 2 or module.rsplit(".", 1)[-1] not in targets or module.endswith("embed_tokens"):
            continue
        out_features, in_features = dims
        tensors[f"base_model.model.{module}.lora_A.weight"] = (
            torch.randn(r, in_features, generator=generator) / in_features**0.5
        )
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_features, r, generator=generator) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), task_type="CAUSAL_LM").save_pretrained(folder)
    return folder
