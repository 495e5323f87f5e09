"""A Hugging Face model folder as the merge sees it: safetensors shards, their index, other files.

The merged model keeps the base model's shard layout and index (tensor names, shapes and dtypes do
not change), so the index is copied as is and each output shard has its input's header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .checkpoint_errors import CheckpointError
from .safetensors_header import SafetensorsFile, TensorSlot, read_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# Files never copied next to the merged weights: other weight formats and their indexes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
SKIPPED_FILES = ("pytorch_model.bin.index.json", "tf_model.h5.index.json", "flax_model.msgpack.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


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
    if not (path / "config.json").is_file():
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
    extra = sorted(
        p for p in path.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.name != INDEX_NAME
        and not p.name.endswith(WEIGHT_SUFFIXES) and p.name not in SKIPPED_FILES
    )  # fmt: skip
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
