"""Which checkpoints in a run's checkpoints folder are complete, and sealing a new one.

Both trainers write ``checkpoint-<step>/`` with ``trainer_state.json`` after the weights, but a
restore from S3 (a SageMaker spot restart) brings files back in no particular order, and a copy
interrupted mid-upload can hold ``trainer_state.json`` without a shard. So after every save each
node's first process writes a seal, ``hpl-complete-node<k>.json``: the node count and the name and
size of every file that node sees in the checkpoint (on a shared file system all of them; on a
training job's local disk that host's own). A checkpoint is complete when the seal of every node
is there and every file the seals list is there at its size: the seals are written last, and they
say what else must have arrived.

Checkpoints written before seals existed (no seal anywhere in the folder) still count by
``trainer_state.json``; once any checkpoint of the run has a seal, one without seals is not complete.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

COMPLETE_MARKER = "trainer_state.json"  # what the trainers write last (checkpoints without seals)
SEAL_PREFIX = "hpl-complete-node"
_SEAL = re.compile(rf"^{SEAL_PREFIX}(\d+)\.json$")
_NAME = re.compile(r"^checkpoint-(\d+)$")


def seal_name(node: int) -> str:
    return f"{SEAL_PREFIX}{node}.json"


def _is_seal(path: Path) -> bool:
    return _SEAL.match(path.name) is not None


def checkpoint_folders(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint-<step> folder, complete or not, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for folder in checkpoints_dir.iterdir():
        match = _NAME.match(folder.name)
        if match and folder.is_dir():
            found.append((int(match.group(1)), folder))
    return sorted(found)


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


def _read_seals(folder: Path) -> list[dict] | None:
    seals = []
    for path in folder.glob(f"{SEAL_PREFIX}*.json"):
        try:
            seals.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            return None  # a seal cut short by the restore: not complete
    return seals


def is_sealed(folder: Path) -> bool:
    """Every node's seal is there, they agree on the node count, and every file they list is there."""
    seals = _read_seals(folder)
    if not seals:
        return False
    nodes = {seal.get("nodes") for seal in seals}
    if len(nodes) != 1 or {seal.get("node") for seal in seals} != set(range(nodes.pop() or 0)):
        return False
    for seal in seals:
        for name, size in seal.get("files", {}).items():
            path = folder / name
            if not path.is_file() or path.stat().st_size != size:
                return False
    return True


def complete_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    folders = checkpoint_folders(checkpoints_dir)
    sealed_run = any(any(folder.glob(f"{SEAL_PREFIX}*.json")) for _, folder in folders)
    if sealed_run:
        return [(step, folder) for step, folder in folders if is_sealed(folder)]
    return [(step, folder) for step, folder in folders if (folder / COMPLETE_MARKER).is_file()]


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


def discard_after(checkpoints_dir: Path, step: int) -> list[Path]:
    """Delete the checkpoint folders newer than ``step``, the newest complete checkpoint (0: none), on this
    node's disk. None of them is complete; saving the same step again into one would mix its leftovers
    (a partial restore's, an interrupted save's) into the new checkpoint and into the seals that list
    what the folder holds. Returns what was deleted."""
    newer = [folder for found, folder in checkpoint_folders(checkpoints_dir) if found > step]
    for folder in newer:
        shutil.rmtree(folder, ignore_errors=True)  # on a shared file system every node may try
    return newer
