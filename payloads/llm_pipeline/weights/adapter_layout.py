"""Where a LoRA adapter sits in a run folder, and in which form.

Accepted inputs, most specific first:
- a plain peft adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``; torch backend);
- a neuronx-distributed adapter folder ``adapter_<name>/`` with ``adapter_config.json`` and
  ``adapter_shards/{mp_metadata_pp_rank_<p>.json, model/dp_rank_00_tp_rank_TT_pp_rank_PP.pt}``
  (optimum-neuron 0.4.x, neuron backend);
- a ``checkpoint-<step>/`` folder holding either of those;
- a checkpoints folder or a run folder: the newest complete checkpoint in it.
neuronx-distributed writes ``adapter_shards/checkpoint`` when a save begins and ``done`` when every
rank has finished, so a sharded adapter with the first marker and not the second is incomplete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import CheckpointError
from llm_pipeline.run_files import CHECKPOINT
from llm_pipeline.weights.adapter_files import CONFIG_NAME, WEIGHTS_NAME
from llm_pipeline.weights.checkpoints import complete_checkpoints

SHARDS_DIR = "adapter_shards"
RANK_FILE = re.compile(r"^dp_rank_(\d+)_tp_rank_(\d+)_pp_rank_(\d+)\.pt$")
METADATA_FILE = re.compile(r"^mp_metadata_pp_rank_(\d+)\.json$")


@dataclass(frozen=True)
class PlainAdapter:
    folder: Path


@dataclass(frozen=True)
class ShardedAdapter:
    folder: Path  # adapter_<name>/
    adapter_name: str
    tp_size: int
    metadata_files: list[Path]  # by pipeline rank
    rank_files: list[list[Path]]  # [pp][tp]


def is_plain(folder: Path) -> bool:
    return (folder / WEIGHTS_NAME).is_file() and (folder / CONFIG_NAME).is_file()


def adapter_folders(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.glob("adapter_*") if (p / SHARDS_DIR).is_dir())


def is_complete_sharded(folder: Path) -> bool:
    shards = folder / SHARDS_DIR
    return not (shards / "checkpoint").is_file() or (shards / "done").is_file()


def adapter_in_checkpoint(checkpoint: Path) -> PlainAdapter | ShardedAdapter | None:
    if is_plain(checkpoint):
        return PlainAdapter(checkpoint)
    folders = adapter_folders(checkpoint)
    if not folders:
        return None
    chosen = [f for f in folders if f.name == "adapter_default"] or folders
    if len(chosen) > 1:
        raise CheckpointError(
            f"{checkpoint} holds several adapters ({', '.join(f.name for f in folders)}); pass one with --checkpoint"
        )
    return sharded_adapter(chosen[0])


def find_adapter(path: Path) -> PlainAdapter | ShardedAdapter:
    """Resolve any accepted input to one adapter; errors say what was expected."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist; train first or pass --checkpoint")
    if (path / SHARDS_DIR).is_dir() and (path / CONFIG_NAME).is_file():
        return sharded_adapter(path)
    found = adapter_in_checkpoint(path)
    if found is not None:
        return found
    if (path / "shards").is_dir():
        raise CheckpointError(
            f"{path} is a full-model checkpoint (shards/), not an adapter: "
            "the consolidate step writes it as a model folder"
        )
    if (path / SHARDS_DIR).is_dir():
        raise CheckpointError(
            f"{path} uses the optimum-neuron 0.1 adapter layout (no adapter_<name>/ folder), which is not supported"
        )
    container = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = [step for step, _ in CHECKPOINT.folders(container)]
    for step, checkpoint in reversed(complete_checkpoints(container)):
        folders = adapter_folders(checkpoint)
        if is_plain(checkpoint) or (folders and all(is_complete_sharded(f) for f in folders)):
            if step != steps[-1]:
                print(f"note: {CHECKPOINT.name(steps[-1])} is incomplete; using {CHECKPOINT.name(step)}", flush=True)
            return adapter_in_checkpoint(checkpoint)
    if steps:
        raise CheckpointError(
            f"no complete checkpoint in {container} (found {CHECKPOINT.name(steps[-1])} but it is incomplete)"
        )
    raise CheckpointError(f"{path} holds no adapter and no checkpoint-<step> folders")


def sharded_adapter(folder: Path) -> ShardedAdapter:
    """Check the file set of a sharded adapter: metadata per pipeline rank, a file per (tp, pp) rank."""
    shards = folder / SHARDS_DIR
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(f"{folder / CONFIG_NAME} is missing; the checkpoint is incomplete")
    if not is_complete_sharded(folder):
        raise CheckpointError(f"{shards} has no 'done' marker: the save was interrupted; use an earlier checkpoint")
    tp_size, metadata_files, rank_files = stage_files(shards, "adapter")
    return ShardedAdapter(
        folder=folder,
        adapter_name=folder.name.removeprefix("adapter_"),
        tp_size=tp_size,
        metadata_files=metadata_files,
        rank_files=rank_files,
    )


def stage_files(shards: Path, what: str) -> tuple[int, list[Path], list[list[Path]]]:
    """(TP size, metadata file per pipeline rank, rank files [pp][tp]) of a neuronx-distributed shards
    folder (``adapter_shards/`` or a full model's ``shards/``), checked complete."""
    metadata = {int(m[1]): p for p in shards.glob("mp_metadata_pp_rank_*") if (m := METADATA_FILE.match(p.name))}
    ranks = {
        (int(m[2]), int(m[3])): p
        for p in (shards / "model").glob("dp_rank_*.pt")
        if (m := RANK_FILE.match(p.name)) and int(m[1]) == 0  # the model is saved by data-parallel rank 0 only
    }
    if not metadata:
        raise CheckpointError(f"{shards} has no mp_metadata_pp_rank_<p>.json; cannot tell how the {what} was split")
    if not ranks:
        raise CheckpointError(f"{shards / 'model'} has no dp_rank_00_tp_rank_*_pp_rank_*.pt files")
    pp_size = max(max(metadata), max(pp for _, pp in ranks)) + 1
    tp_size = max(tp for tp, _ in ranks) + 1
    for pp in range(pp_size):
        if pp not in metadata:
            raise CheckpointError(
                f"{shards / f'mp_metadata_pp_rank_{pp}.json'} is missing (rank files exist for pipeline rank {pp})"
            )
        for tp in range(tp_size):
            if (tp, pp) not in ranks:
                raise CheckpointError(
                    f"rank file {shards / 'model' / f'dp_rank_00_tp_rank_{tp:02d}_pp_rank_{pp:02d}.pt'} is missing "
                    f"(other files show TP={tp_size}); the checkpoint was copied partially"
                )
    return (
        tp_size,
        [metadata[pp] for pp in range(pp_size)],
        [[ranks[(tp, pp)] for tp in range(tp_size)] for pp in range(pp_size)],
    )
