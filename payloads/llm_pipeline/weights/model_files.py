"""A Hugging Face model folder on disk: what it must hold, its shards and index, the dtype of its weights.

Only safetensors headers are read (safetensors_header), so checking a 16 GB model costs a few
kilobytes of reads and needs no torch. The merge keeps the base model's shard layout and index
(tensor names, shapes and dtypes do not change), so the index is copied as is and each output shard
has its input's header. Every bad input is a CheckpointError naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.safetensors_header import FLOAT_DTYPES, SafetensorsFile, TensorSlot, read_header

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # fast tokenizer or sentencepiece model
# Every file that can change how text is tokenized or templated (the data step records their digest).
TOKENIZER_DEFINITION_FILES = (
    TOKENIZER_CONFIG,
    *TOKENIZER_FILES,
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
SAFETENSORS_CODES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
# Files never copied next to the merged weights: other weight formats and their indexes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
SKIPPED_FILES = ("pytorch_model.bin.index.json", "tf_model.h5.index.json", "flax_model.msgpack.index.json")


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    shards: list[SafetensorsFile]
    index_file: Path | None
    extra_files: list[Path]  # config, generation config, tokenizer, license...

    @property
    def tensors(self) -> dict[str, TensorSlot]:
        return {name: slot for shard in self.shards for name, slot in shard.tensors.items()}

    @property
    def total_bytes(self) -> int:
        return sum(shard.size for shard in self.shards)

    @property
    def has_tokenizer(self) -> bool:
        return any((self.path / name).is_file() for name in TOKENIZER_FILES)


def open_model_folder(path: Path) -> ModelFolder:
    """Find and check the shards of a model folder; errors name the missing or broken file."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"base model folder {path} does not exist; run the download step or pass --base")
    if not (path / CONFIG_NAME).is_file():
        raise CheckpointError(f"{path} has no config.json: not a Hugging Face model folder")
    index_file = path / INDEX_NAME
    if index_file.is_file():
        weight_map = read_weight_map(index_file)
        names = sorted(set(weight_map.values()))
    elif (path / SINGLE_NAME).is_file():
        index_file, weight_map, names = None, None, [SINGLE_NAME]
    elif any(path.glob("*.bin")):
        raise CheckpointError(
            f"{path} holds only PyTorch .bin weights; the merge streams safetensors: save the model "
            "with safe_serialization=True (the download step does)"
        )
    else:
        raise CheckpointError(f"{path} has no {SINGLE_NAME} and no {INDEX_NAME}")
    shards = []
    for name in names:
        if not (path / name).is_file():
            raise CheckpointError(f"shard {path / name} listed in {INDEX_NAME} is missing; download the model again")
        shards.append(read_header(path / name))
    _check_names(path, shards, weight_map)
    extra = sorted(p for p in path.iterdir() if p.is_file() and _is_extra_file(p.name))
    return ModelFolder(path=path, shards=shards, index_file=index_file, extra_files=extra)


def read_weight_map(index_file: Path) -> dict[str, str]:
    """The tensor -> shard map of a safetensors index; a broken index is a CheckpointError."""
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_file} is not a valid safetensors index ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_file} has an empty or invalid weight_map")
    return weight_map


def _check_names(path: Path, shards: list[SafetensorsFile], weight_map: dict[str, str] | None) -> None:
    seen: dict[str, str] = {}
    for shard in shards:
        for name in shard.tensors:
            if name in seen:
                raise CheckpointError(f"tensor {name} is stored twice, in {seen[name]} and {shard.path.name}")
            seen[name] = shard.path.name
    if weight_map is None:
        return
    for name, file in weight_map.items():
        if seen.get(name) != file:
            raise CheckpointError(f"{path / INDEX_NAME} maps {name} to {file}, but that shard does not hold it")
    unlisted = sorted(set(seen) - set(weight_map))
    if unlisted:
        raise CheckpointError(f"{path / INDEX_NAME} does not list {unlisted[0]} (stored in {seen[unlisted[0]]})")


def _is_extra_file(name: str) -> bool:
    """Config, tokenizer, licence...: everything but weights, their indexes and hidden files."""
    return (
        not name.startswith(".")
        and name != INDEX_NAME
        and not name.endswith(WEIGHT_SUFFIXES)
        and name not in SKIPPED_FILES
    )


def read_model_config(model_dir: str | Path) -> dict[str, Any] | None:
    """A model folder's config.json; None while there is none (not downloaded yet: nothing to check against)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): download the model again") from None


def require_model_folder(folder: Path, purpose: str) -> Path:
    """Stop early with a clear message when `folder` is not a model folder."""
    if not folder.is_dir():
        raise CheckpointError(
            f"model folder {folder} does not exist ({purpose}); run the download step or fix paths.model_dir"
        )
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"model folder {folder} has no {CONFIG_NAME} ({purpose}); it is not a Hugging Face model folder"
        )
    return folder


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files the folder declares (index) or holds (single file); may not all exist."""
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map = read_weight_map(index)
        return [folder / name for name in sorted(set(weight_map.values()))]
    if (folder / SINGLE_NAME).is_file():
        return [folder / SINGLE_NAME]
    return []


def float_codes(path: Path) -> set[str]:
    """The floating-point dtype codes used by one safetensors file."""
    return {slot.dtype for slot in read_header(path).tensors.values() if slot.dtype in FLOAT_DTYPES}


def missing_parts(folder: Path) -> list[str]:
    """What a usable model folder lacks: config, tokenizer, weight shards (empty list = complete)."""
    missing = [name for name in (CONFIG_NAME, TOKENIZER_CONFIG) if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    shards = weight_files(folder)
    if not shards:
        missing.append(f"{SINGLE_NAME} or {INDEX_NAME}")
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
    except CheckpointError:  # a truncated shard: not complete
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
            name: tensor.to(target) if tensor.is_floating_point() else tensor
            for name, tensor in load_file(shard).items()
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
    config_path = folder / CONFIG_NAME
    config = json.loads(config_path.read_text())
    keys = [key for key in ("torch_dtype", "dtype") if key in config] or ["torch_dtype"]
    for key in keys:
        config[key] = dtype
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        total = sum(slot.nbytes for shard in weight_files(folder) for slot in read_header(shard).tensors.values())
        index.setdefault("metadata", {})["total_size"] = total
        index_path.write_text(json.dumps(index, indent=2) + "\n")


def share(folder: Path) -> int:
    """Give this user's files in a shared model folder group read-write and everyone read, so another cluster
    user reuses or completes them (safetensors writes its files 0600, whatever the umask or the folder's default
    ACL: docs/teams.md); the count of paths changed."""
    changed = 0
    for path in [folder, *sorted(folder.rglob("*"))]:
        info = path.lstat()
        if path.is_symlink() or info.st_uid != os.getuid():
            continue
        mode = info.st_mode & 0o7777
        wanted = mode | (0o775 if path.is_dir() else 0o664)
        if wanted != mode:
            path.chmod(wanted)
            changed += 1
    return changed
