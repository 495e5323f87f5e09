"""Finding the newest complete checkpoint in a run's checkpoints folder.

Both trainers (transformers and optimum-neuron) write `checkpoint-<step>/` and put
`trainer_state.json` in it after the weights, so its presence marks a checkpoint as complete; a
folder left half-written by a killed job is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

COMPLETE_MARKER = "trainer_state.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for folder in checkpoints_dir.iterdir():
        match = _NAME.match(folder.name)
        if match and folder.is_dir() and (folder / COMPLETE_MARKER).is_file():
            found.append((int(match.group(1)), folder))
    return sorted(found)


def newest_complete(checkpoints_dir: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(checkpoints_dir)
    return found[-1] if found else None
