"""Which checkpoints in a run's checkpoints folder are complete, and sealing a new one.

Both trainers write ``checkpoint-<step>/`` with ``trainer_state.json`` after the weights, but a
restore from S3 (a SageMaker spot restart) brings files back in no particular order, and a copy
interrupted mid-upload can hold ``trainer_state.json`` without a shard. So after every save each
node's first process writes a seal, ``hpl-complete-node<k>.json``: the node count and the name and
size of every file that node sees in the checkpoint (on a shared file system all of them; on a
training job's local disk that host's own). A checkpoint is complete when the seal of every node
is there and every file the seals list is there at its size: the seals are written last, and they
say what else must have arrived.

On a training job with several hosts each host holds its own part: its ranks' files
(PER_RANK_FILE) and its seal; the first host also the shared files (trainer_state.json,
scheduler.pt, the .metadata of each sharded folder, an adapter). ``held_steps`` says which parts a
host holds, ``shared_files`` what the first host sends the others so they can resume (gather.py).

Checkpoints written before seals existed (no seal anywhere in the folder) still count by
``trainer_state.json``; once any checkpoint of the run has a seal, one without seals is not complete.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from llm_pipeline.run_files import CHECKPOINT

COMPLETE_MARKER = "trainer_state.json"  # what the trainers write last (checkpoints without seals)
SEAL_PREFIX = "hpl-complete-node"
_SEAL = re.compile(rf"^{SEAL_PREFIX}(\d+)\.json$")
# What one process writes for itself: torch's sharded checkpoint files and the Trainer's RNG state.
PER_RANK_FILE = re.compile(r"(^|/)(__\d+_\d+\.distcp|rng_state_\d+\.pth)$")


def seal_name(node: int) -> str:
    return f"{SEAL_PREFIX}{node}.json"


def _is_seal(path: Path) -> bool:
    return _SEAL.match(path.name) is not None


def checkpoint_folders(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint-<step> folder, complete or not, oldest first."""
    return CHECKPOINT.folders(checkpoints_dir)


def write_seal(folder: Path, *, node: int, nodes: int) -> Path:
    """Seal this node's part of a checkpoint; call once every process has finished writing it."""
    files = {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not _is_seal(path) and not path.name.endswith(".tmp")
    }
    seal = folder / seal_name(node)
    temporary = seal.with_name(seal.name + ".tmp")
    temporary.write_text(json.dumps({"node": node, "nodes": nodes, "files": files}, indent=1) + "\n")
    temporary.replace(seal)
    return seal


def checkpoint_step(folder: Path) -> int:
    step = CHECKPOINT.step_of(Path(folder).name)
    if step is None:
        raise ValueError(f"{folder} is not a {CHECKPOINT.name('<step>')} folder")
    return step


def _read_seals(folder: Path) -> list[dict] | None:
    seals = []
    for path in folder.glob(f"{SEAL_PREFIX}*.json"):
        try:
            seals.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            return None  # a seal cut short by the restore: not complete
    return seals


def _files_present(folder: Path, seal: dict) -> bool:
    return all(
        (folder / name).is_file() and (folder / name).stat().st_size == size
        for name, size in seal.get("files", {}).items()
    )


def is_sealed(folder: Path) -> bool:
    """Every node's seal is there, they agree on the node count, and every file they list is there."""
    seals = _read_seals(folder)
    if not seals:
        return False
    nodes = {seal.get("nodes") for seal in seals}
    if len(nodes) != 1 or {seal.get("node") for seal in seals} != set(range(nodes.pop() or 0)):
        return False
    return all(_files_present(folder, seal) for seal in seals)


def _own_seal(folder: Path, node: int) -> dict | None:
    try:
        return json.loads((folder / seal_name(node)).read_text())
    except (OSError, json.JSONDecodeError):
        return None  # not written, or cut short by the restore


def part_complete(folder: Path, node: int) -> bool:
    """This node's part of the checkpoint is here: its seal and every file the seal lists, at its size."""
    seal = _own_seal(folder, node)
    return seal is not None and _files_present(folder, seal)


def shared_files(folder: Path, node: int = 0) -> list[str]:
    """The files of ``node``'s part that are not one process's own: what another host needs to resume."""
    seal = _own_seal(folder, node)
    if seal is None:
        raise FileNotFoundError(f"{folder / seal_name(node)} is missing or unreadable")
    return [name for name in seal.get("files", {}) if not PER_RANK_FILE.search(name)]


def has_seals(folders: list[tuple[int, Path]]) -> bool:
    """A run written with seals: from then on a checkpoint without them is not complete."""
    return any(any(folder.glob(f"{SEAL_PREFIX}*.json")) for _, folder in folders)


def complete_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    folders = checkpoint_folders(checkpoints_dir)
    if has_seals(folders):
        return [(step, folder) for step, folder in folders if is_sealed(folder)]
    return [(step, folder) for step, folder in folders if (folder / COMPLETE_MARKER).is_file()]


def held_steps(checkpoints_dir: Path, node: int) -> list[int]:
    """Steps whose part of ``node`` this host holds complete (without seals: the complete checkpoints)."""
    folders = checkpoint_folders(checkpoints_dir)
    if not has_seals(folders):
        return [step for step, _ in complete_checkpoints(checkpoints_dir)]
    return [step for step, folder in folders if part_complete(folder, node)]


def newest_complete(checkpoints_dir: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def prune(checkpoints_dir: Path, *, keep: int, node: int) -> list[Path]:
    """Keep the newest ``keep`` checkpoints this node has sealed and delete every folder older than
    them, on this node's disk (the trainer prunes only where global rank 0 runs; on a training job
    every host has its own disk). Returns what was deleted."""
    folders = checkpoint_folders(checkpoints_dir)
    sealed = [step for step, folder in folders if (folder / seal_name(node)).is_file()]
    if keep < 1 or len(sealed) <= keep:
        return []
    oldest_kept = sealed[-keep]
    old = [folder for step, folder in folders if step < oldest_kept]
    for folder in old:
        shutil.rmtree(folder, ignore_errors=True)
    return old
