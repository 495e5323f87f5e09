"""Where a full-model (not adapter) checkpoint sits in a run folder, and which backend wrote it: found
without torch, so the consolidate step loads torch only for the checkpoint it converts.

Neuron backend: optimum-neuron 0.4.5 saves full fine-tuning checkpoints as ``checkpoint-<step>/`` holding
``config.json``, the tokenizer, ``trainer_state.json`` and ``shards/`` with
``mp_metadata_pp_rank_<p>.json``, ``model/dp_rank_00_tp_rank_TT_pp_rank_PP.pt`` (xser or plain),
``optim/`` (ZeRO-1 optimizer state, one file per data-parallel rank; not needed to consolidate, and
absent when saved with ``save_only_model`` as the neuron engine does) and
the ``checkpoint``/``done`` markers neuronx-distributed writes at the start and end of a save.
Torch backend: the Trainer's ``checkpoint-<step>/`` with the model's safetensors (one process or DDP) or
``pytorch_model_fsdp_0/`` (FSDP2), read by weights/torch_checkpoint.
Accepted inputs: such a checkpoint folder, or a checkpoints/run folder (its newest complete one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import CheckpointError
from llm_pipeline.run_files import CHECKPOINT
from llm_pipeline.weights.adapter_files import CONFIG_NAME as ADAPTER_CONFIG
from llm_pipeline.weights.adapter_layout import stage_files
from llm_pipeline.weights.checkpoints import complete_checkpoints
from llm_pipeline.weights.model_files import INDEX_NAME, SINGLE_NAME

SHARDS_DIR = "shards"  # optimum-neuron's MODEL_PARALLEL_SHARDS_DIR_NAME
FSDP_MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's name for the first model's distributed checkpoint


@dataclass(frozen=True)
class FullCheckpoint:
    folder: Path  # checkpoint-<step>/
    tp_size: int
    metadata_files: list[Path]  # by pipeline rank
    rank_files: list[list[Path]]  # [pp][tp]


def holds_full_model(checkpoint: Path) -> bool:
    return (checkpoint / SHARDS_DIR / "model").is_dir()


def is_complete(checkpoint: Path) -> bool:
    shards = checkpoint / SHARDS_DIR
    return not (shards / "checkpoint").is_file() or (shards / "done").is_file()


def find_full_checkpoint(path: Path) -> FullCheckpoint | None:
    """The full-model checkpoint at ``path`` (or the newest complete one under it); None when it holds none."""
    path = Path(path)
    if holds_full_model(path):
        return full_checkpoint(path)
    container = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = complete_checkpoints(container)
    if not found or not any(holds_full_model(folder) for _, folder in found):
        return None
    steps = [step for step, _ in CHECKPOINT.folders(container)]
    for step, checkpoint in reversed(found):
        if holds_full_model(checkpoint) and is_complete(checkpoint):
            if step != steps[-1]:
                print(f"note: {CHECKPOINT.name(steps[-1])} is incomplete; using {CHECKPOINT.name(step)}", flush=True)
            return full_checkpoint(checkpoint)
    raise CheckpointError(f"no complete full-model checkpoint in {container} (every shards/ save was interrupted)")


def full_checkpoint(folder: Path) -> FullCheckpoint:
    shards = folder / SHARDS_DIR
    if not is_complete(folder):
        raise CheckpointError(f"{shards} has no 'done' marker: the save was interrupted; use an earlier checkpoint")
    tp_size, metadata_files, rank_files = stage_files(shards, "model")
    return FullCheckpoint(folder=folder, tp_size=tp_size, metadata_files=metadata_files, rank_files=rank_files)


def is_torch_full_checkpoint(folder: Path) -> bool:
    """A torch backend checkpoint holding every weight (not an adapter)."""
    if (folder / ADAPTER_CONFIG).is_file():
        return False
    return (folder / FSDP_MODEL_DIR / ".metadata").is_file() or any(
        (folder / name).is_file() for name in (SINGLE_NAME, INDEX_NAME)
    )


def find_torch_full_checkpoint(path: Path) -> Path | None:
    """The checkpoint at ``path``, or the newest complete one under it (or its checkpoints/), if full."""
    path = Path(path)
    if is_torch_full_checkpoint(path):
        return path
    container = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = complete_checkpoints(container)
    if found and is_torch_full_checkpoint(found[-1][1]):
        return found[-1][1]
    return None
