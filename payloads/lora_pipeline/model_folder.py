"""A Hub-style model folder on disk: what it must hold, the dtype of its weights, converting them.

Only safetensors headers are read (safetensors_header), so checking a 16 GB model costs a few
kilobytes of reads and needs no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from lora_pipeline import safetensors_header
from lora_pipeline.checkpoint_errors import CheckpointError
from lora_pipeline.errors import StepError
from lora_pipeline.model_files import INDEX_NAME as INDEX
from lora_pipeline.model_files import SINGLE_NAME as SINGLE_WEIGHTS
from lora_pipeline.model_files import read_weight_map
from lora_pipeline.safetensors_header import FLOAT_DTYPES, SafetensorsFile

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # fast tokenizer or sentencepiece model
SAFETENSORS_CODES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def require_model_folder(folder: Path, purpose: str) -> Path:
    """Stop early with a clear message when `folder` is not a model folder."""
    if not folder.is_dir():
        raise StepError(f"model folder {folder} does not exist ({purpose}); run the download step or fix paths.model_dir")
    if not (folder / CONFIG).is_file():
        raise StepError(f"model folder {folder} has no {CONFIG} ({purpose}); it is not a Hugging Face model folder")
    return folder


def read_header(path: Path) -> SafetensorsFile:
    """The checked header of one safetensors file; a truncated or foreign file is a StepError."""
    try:
        return safetensors_header.read_header(path)
    except CheckpointError as exc:
        raise StepError(str(exc)) from None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files the folder declares (index) or holds (single file); may not all exist."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = read_weight_map(index)
        except CheckpointError as exc:
            raise StepError(str(exc)) from None
        return [folder / name for name in sorted(set(weight_map.values()))]
    if (folder / SINGLE_WEIGHTS).is_file():
        return [folder / SINGLE_WEIGHTS]
    return []


def float_codes(path: Path) -> set[str]:
    """The floating-point dtype codes used by one safetensors file."""
    return {slot.dtype for slot in read_header(path).tensors.values() if slot.dtype in FLOAT_DTYPES}


def missing_parts(folder: Path) -> list[str]:
    """What a usable model folder lacks: config, tokenizer, weight shards (empty list = complete)."""
    missing = [name for name in (CONFIG, TOKENIZER_CONFIG) if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    shards = weight_files(folder)
    if not shards:
        missing.append(f"{SINGLE_WEIGHTS} or {INDEX}")
    missing += [shard.name for shard in shards if not shard.is_file()]
    return missing


def wrong_dtype_shards(folder: Path, dtype: str) -> list[Path]:
    """Shards holding floating-point tensors in another dtype than `dtype`."""
    wanted = SAFETENSORS_CODES[dtype]
    return [shard for shard in weight_files(folder) if float_codes(shard) - {wanted}]


def is_complete(folder: Path, dtype: str) -> bool:
    """True when the folder holds config, tokenizer and every shard, all in `dtype` and readable."""
    if not folder.is_dir() or missing_parts(folder):
        return False
    try:
        return not wrong_dtype_shards(folder, dtype)
    except StepError:  # a truncated shard: not complete
        return False


def convert_dtype(folder: Path, dtype: str, progress: Callable[[str], None] = print) -> int:
    """Cast the floating-point weights to `dtype`, one shard in memory at a time; returns shards converted."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    shards = wrong_dtype_shards(folder, dtype)
    for number, shard in enumerate(shards, 1):
        progress(f"converting {shard.name} to {dtype} ({number}/{len(shards)})")
        tensors = {
            name: tensor.to(target) if tensor.is_floating_point() else tensor for name, tensor in load_file(shard).items()
        }
        partial = shard.with_name(shard.name + ".converting")
        save_file(tensors, partial, metadata={"format": "pt"})
        os.replace(partial, shard)
        del tensors
    if shards:
        _record_dtype(folder, dtype)
    return len(shards)


def _record_dtype(folder: Path, dtype: str) -> None:
    """Make config.json and the index agree with the converted weights."""
    config_path = folder / CONFIG
    config = json.loads(config_path.read_text())
    keys = [key for key in ("torch_dtype", "dtype") if key in config] or ["torch_dtype"]
    for key in keys:
        config[key] = dtype
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    index_path = folder / INDEX
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        total = sum(slot.nbytes for shard in weight_files(folder) for slot in read_header(shard).tensors.values())
        index.setdefault("metadata", {})["total_size"] = total
        index_path.write_text(json.dumps(index, indent=2) + "\n")
