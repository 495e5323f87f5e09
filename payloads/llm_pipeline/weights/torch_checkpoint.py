"""A full-model checkpoint of the torch backend -> a Hugging Face model folder (weights/full_checkpoint finds it).

The transformers Trainer writes `train.method = full` checkpoints in one of two forms:
- one process or DDP: ``checkpoint-N/model.safetensors`` (or shards + index), as save_pretrained;
- FSDP2: ``checkpoint-N/pytorch_model_fsdp_0/``, a torch distributed checkpoint (one ``.distcp``
  file per rank plus ``.metadata``) whose keys are the model's names under ``model.``.
Either way the output is the base model's layout: the same tensor names, cast to the run's model
dtype, in ``model-0000i-of-0000n.safetensors`` shards with an index (``model.safetensors`` when one
shard holds it all), and the base folder's config, generation config and tokenizer files. Tensors are
read one at a time and written one shard at a time, so memory is bounded by one shard.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.full_checkpoint import FSDP_MODEL_DIR
from llm_pipeline.weights.model_files import INDEX_NAME, SINGLE_NAME, open_model_folder

FSDP_KEY_PREFIX = "model."
MAX_SHARD_BYTES = 5 * 10**9  # save_pretrained's default max_shard_size


def _distributed_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(folder))
    for key, meta in reader.read_metadata().state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata) or not key.startswith(FSDP_KEY_PREFIX):
            continue
        tensor = torch.empty(meta.size, dtype=meta.properties.dtype)
        dcp.load({key: tensor}, storage_reader=reader, no_dist=True)  # gathers every rank's shard
        yield key[len(FSDP_KEY_PREFIX) :], tensor


def _safetensors_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    model = open_model_folder(folder)
    for shard in model.shards:
        with safe_open(str(shard.path), "pt") as handle:
            for name in shard.tensors:
                yield name, handle.get_tensor(name)


def checkpoint_tensors(checkpoint: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the checkpoint, full size, one at a time."""
    if (checkpoint / FSDP_MODEL_DIR).is_dir():
        return _distributed_tensors(checkpoint / FSDP_MODEL_DIR)
    return _safetensors_tensors(checkpoint)


def write_model_folder(checkpoint: Path, base: Path, output: Path, dtype: str) -> dict[str, int]:
    """Write the HF folder of ``checkpoint`` into ``output`` (an empty folder); returns counts."""
    base_model = open_model_folder(base)
    expected = set(base_model.tensors)
    target = getattr(torch, dtype)
    shards: list[dict[str, torch.Tensor]] = [{}]
    names: list[list[str]] = [[]]
    size = total = 0
    seen: set[str] = set()
    files: list[str] = []

    def flush(final: bool) -> None:
        file_name = f"part-{len(files):05d}.safetensors"
        save_file(shards[-1], str(output / file_name), metadata={"format": "pt"})
        files.append(file_name)
        shards[-1] = {}
        if not final:
            names.append([])

    for name, tensor in checkpoint_tensors(checkpoint):
        if name == "lm_head.weight" and name not in expected and "model.embed_tokens.weight" in expected:
            continue  # tied to the embedding: the base folder stores it once, so does the output
        if name not in expected:
            raise CheckpointError(
                f"{checkpoint}: tensor {name} is not in the base model {base}; the checkpoint is from another model"
            )
        tensor = tensor.to(target).contiguous() if tensor.is_floating_point() else tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            flush(final=False)
            size = 0
        shards[-1][name] = tensor
        names[-1].append(name)
        seen.add(name)
        size += nbytes
        total += nbytes
    missing = sorted(expected - seen)
    if missing:
        raise CheckpointError(f"{checkpoint} lacks {len(missing)} weight(s) of the base model, e.g. {missing[0]}")
    flush(final=True)
    _name_shards(output, files, names, total)
    for path in base_model.extra_files:
        shutil.copy2(path, output / path.name)
    return {"tensors": len(seen), "bytes": total, "shards": len(files)}


def _name_shards(output: Path, files: list[str], names: list[list[str]], total: int) -> None:
    """Rename the parts as save_pretrained names shards, with an index when there are several."""
    if len(files) == 1:
        (output / files[0]).rename(output / SINGLE_NAME)
        return
    weight_map = {}
    for number, (part, members) in enumerate(zip(files, names, strict=True), 1):
        final = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        (output / part).rename(output / final)
        weight_map.update(dict.fromkeys(members, final))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (output / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
