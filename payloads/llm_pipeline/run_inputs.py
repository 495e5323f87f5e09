"""Digests of what a run reads besides its config (run_files.INPUTS): the model's weights, its tokenizer, the
local dataset file(s) and the prepared data. Each checkpoint records them (run_files.TrainedFrom) and every later
move compares (run_state.differences), so refilled weights or a dataset rewritten in place are never trained on
or merged silently.

A file's digest is the sha256 of its bytes; a safetensors file's also covers its header, read every time (a few
kilobytes), so a file rewritten with its size and time kept still differs. Hashing a model is minutes, so each
file's hash is cached by its size, modification time (and header digest) in the run folder
(DIGEST_CACHE): computed once per run and file, shared by the train, consolidate and merge steps; a flock on the
cache lets one process hash while the others wait and read its result (where the file system refuses flock, each
hashes for itself; the cache is replaced whole either way).

Stdlib only (safetensors headers are read by hand: weights/safetensors_header.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.run_files import DATA_SOURCE_FILE, INPUTS, TrainedFrom
from llm_pipeline.weights import model_files
from llm_pipeline.weights.safetensors_header import read_header

# In paths.output_dir, not checkpoints/: on a training job's other hosts that is a link into the synced folder,
# where each writes only its own ranks' files (jobs/sagemaker_env.py). {path: {size, mtime_ns, header, sha256}}
DIGEST_CACHE = ".input_digests.json"
MODEL_INPUTS = ("model weights", "tokenizer")  # what merge adds the adapter to, beside the adapter
_CHUNK = 16 * 1024 * 1024
# Not the prepared data: the results of a map on a loaded dataset, which datasets writes beside it
# (cache-<fingerprint>.arrow: the train step's), and its bookkeeping (state.json: a fingerprint that is random
# when a transform cannot be hashed, so preparing the same data twice differs there only).
DATASETS_CACHE_PREFIX = "cache-"
DATASETS_STATE_FILE = "state.json"
# Nor the data step's record of what it prepared from (run_files.DataSource: the [data] keys, the seed and the
# tokenizer and dataset digests, the latter by file time): those are compared as keys and inputs of their own.
NOT_PREPARED_DATA = (DATASETS_STATE_FILE, DATA_SOURCE_FILE)


class DigestCache:
    """File digests by path, valid while the file's size, modification time and header digest are unchanged."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / DIGEST_CACHE
        self.entries: dict[str, dict] = {}
        self.changed = False

    def __enter__(self) -> DigestCache:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "a")  # held until __exit__ (the lock)
        with contextlib.suppress(OSError):  # FSx mounted without flock: each process hashes for itself
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self.entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}  # none yet, or cut short: hash again
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.changed:
                partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                partial.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
                partial.replace(self.path)
        finally:
            self._lock.close()  # releases the lock

    def digest(self, path: Path) -> str:
        stat = path.stat()
        header = hashlib.sha256(read_header(path).header).hexdigest() if path.suffix == ".safetensors" else ""
        key = str(path.resolve())
        entry = self.entries.get(key)
        if entry and (entry["size"], entry["mtime_ns"], entry["header"]) == (stat.st_size, stat.st_mtime_ns, header):
            return entry["sha256"]
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        self.entries[key] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "header": header,
            "sha256": digest.hexdigest(),
        }
        self.changed = True
        return digest.hexdigest()

    def files_digest(self, files: Iterable[tuple[str, Path]]) -> str:
        """One digest of (name, file) pairs: their names and contents; "" when there are none."""
        listed = sorted(files)
        if not listed:
            return ""
        combined = hashlib.sha256()
        for name, path in listed:
            combined.update(f"{name}\0{self.digest(path)}\0".encode())
        return combined.hexdigest()[:16]


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    return [(path.relative_to(folder).as_posix(), path) for path in sorted(folder.rglob("*")) if path.is_file()]


def _prepared_files(folder: Path) -> list[tuple[str, Path]]:
    return [
        (name, path)
        for name, path in _folder_files(folder)
        if not path.name.startswith(DATASETS_CACHE_PREFIX) and path.name not in NOT_PREPARED_DATA
    ]


def _model_files(folder: Path) -> list[tuple[str, Path]]:
    weights = model_files.weight_files(folder) or sorted(
        path for path in folder.iterdir() if path.name.endswith(model_files.WEIGHT_SUFFIXES)
    )
    named = [*weights, folder / model_files.CONFIG_NAME]
    return [(path.name, path) for path in named if path.is_file()]


def _tokenizer_files(folder: Path) -> list[tuple[str, Path]]:
    named = (folder / name for name in model_files.TOKENIZER_DEFINITION_FILES)
    return [(path.name, path) for path in named if path.is_file()]


def _dataset_files(spec: str) -> list[tuple[str, Path]]:
    path = Path(spec).expanduser()
    if path.is_file():
        return [(path.name, path)]
    return _folder_files(path) if path.is_dir() else []  # a Hub id: named by the [data] keys


def input_digests(cfg: RunConfig, names: Iterable[str] = INPUTS) -> dict[str, str]:
    """{input: digest} of ``names`` (run_files.INPUTS) as the run's files are now; "" for one that is absent."""
    model_dir, data_dir = Path(cfg.paths.model_dir), Path(cfg.paths.data_dir)
    listers = {
        "model weights": lambda: _model_files(model_dir) if model_dir.is_dir() else [],
        "tokenizer": lambda: _tokenizer_files(model_dir) if model_dir.is_dir() else [],
        "dataset": lambda: _dataset_files(cfg.data.dataset),
        "prepared data": lambda: _prepared_files(data_dir) if data_dir.is_dir() else [],
    }
    with DigestCache(Path(cfg.paths.output_dir)) as cache:
        return {name: cache.files_digest(listers[name]()) for name in names}


def folder_digest(cfg: RunConfig, folder: Path) -> str:
    """One digest of every file under ``folder`` (names and contents; "" when it has none), cached like the inputs'."""
    with DigestCache(Path(cfg.paths.output_dir)) as cache:
        return cache.files_digest(_folder_files(folder) if folder.is_dir() else [])


def trained_from(cfg: RunConfig, learned: dict[str, dict], names: Iterable[str] = INPUTS) -> TrainedFrom:
    """What a checkpoint trained now with this config would record (JSON types, as read back from its file):
    ``learned``, the config's learning values (RunConfig.learned, read by the caller with its other keys), and the
    digests of its inputs now."""
    made = TrainedFrom(learned, input_digests(cfg, names))
    return TrainedFrom.from_json(made.to_json())
