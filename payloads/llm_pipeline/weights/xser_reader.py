"""Read one neuronx-distributed rank file, in the xser form or the plain form, without torch_xla.

Plain form: ``dp_rank_00_tp_rank_TT_pp_rank_PP.pt`` is a ``torch.save``d ``{name: tensor}`` dict.
xser form (optimum-neuron's default, ``use_xser=True``): that file holds the same dict with each
tensor replaced by a ``torch_xla.utils.serialization.TensorReference(tid)``; tensor ``tid`` is
``<file>.tensors/tensor_<tid>.pt`` and ``<file>.info.pt`` records every tid's dtype and shape.
Unpickling maps that torch_xla class to a small stand-in, inside torch's weights-only unpickler,
so reading never runs code from the checkpoint and never needs torch_xla.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from llm_pipeline.errors import CheckpointError

XSER_REFERENCE = "torch_xla.utils.serialization.TensorReference"


class TensorReference:
    """Stand-in for torch_xla's TensorReference: only the tensor id matters (older ones add shape/dtype)."""

    def __init__(self, tid: int | None = None, shape: Any = None, dtype: Any = None) -> None:
        self.tid, self.shape, self.dtype = tid, shape, dtype


def _load(path: Path, what: str, *, mmap: bool = False) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{what} {path} is missing; the checkpoint is incomplete or was copied partially")
    try:
        with torch.serialization.safe_globals([(TensorReference, XSER_REFERENCE)]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{what} {path} cannot be read ({first_line}); it may be truncated or corrupt") from None


def load_rank_file(path: Path) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` dict of one rank, xser references resolved."""
    path = Path(path)
    state = _load(path, "rank file")
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"rank file {path} does not hold a {{name: tensor}} dict")
    info_path = path.with_name(path.name + ".info.pt")
    info = _load(info_path, "xser info file") if info_path.is_file() else {}
    tensors: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if isinstance(value, TensorReference):
            value = _load_reference(path, name, value, info)
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"rank file {path}: entry {name!r} is a {type(value).__name__}, not a tensor")
        tensors[name] = value
    return tensors


def _load_reference(path: Path, name: str, ref: TensorReference, info: dict, *, mmap: bool = False) -> torch.Tensor:
    tensor_file = path.with_name(path.name + ".tensors") / f"tensor_{ref.tid}.pt"
    if mmap and tensor_file.is_file():  # start reading the whole file now; the map then finds it cached
        fd = os.open(tensor_file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    tensor = _load(tensor_file, f"xser tensor file for {name!r}:", mmap=mmap)
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"xser tensor file {tensor_file} does not hold a tensor")
    expected = info.get(ref.tid) or {"dtype": getattr(ref, "dtype", None), "shape": getattr(ref, "shape", None)}
    for key, actual in (("dtype", tensor.dtype), ("shape", tuple(tensor.shape))):
        want = expected.get(key)
        if want is not None and (tuple(want) if key == "shape" else want) != actual:
            raise CheckpointError(
                f"xser tensor file {tensor_file} for {name!r} has {key} {actual}, but {path.name}.info.pt says {want}"
            )
    return tensor


class LazyRankFile:
    """One rank file read a few tensors at a time, so memory holds what is being rebuilt, not the file.

    xser: the reference dict and ``.info.pt`` give every tensor's id, dtype and shape; a tensor is
    its own file, asked to be read ahead, then memory-mapped. Plain: the file is memory-mapped and
    the batch's tensors are views into it. Either way no copy is made into this process's memory,
    and a map goes away with the last tensor using it, so pages never accumulate here.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.xser = self.path.with_name(self.path.name + ".tensors").is_dir()
        state = _load(self.path, "rank file") if self.xser else self._mapped()
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise CheckpointError(f"rank file {self.path} does not hold a {{name: tensor}} dict")
        info_path = self.path.with_name(self.path.name + ".info.pt")
        info = _load(info_path, "xser info file") if self.xser and info_path.is_file() else {}
        self._refs: dict[str, TensorReference] = {}
        self._inline: dict[str, torch.Tensor] = {}  # xser files may keep a small tensor in the dict itself
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        for name, value in state.items():
            if isinstance(value, TensorReference):
                self._refs[name] = value
                known = info.get(value.tid) or {}
                dtype, shape = (
                    known.get("dtype", getattr(value, "dtype", None)),
                    known.get("shape", getattr(value, "shape", None)),
                )
                if dtype is None or shape is None:  # no info file: read the tensor once to learn it
                    tensor = _load_reference(self.path, name, value, info)
                    dtype, shape = tensor.dtype, tensor.shape
                self.dtypes[name], self.shapes[name] = dtype, tuple(shape)
            elif isinstance(value, torch.Tensor):
                self.dtypes[name], self.shapes[name] = value.dtype, tuple(value.shape)
                if self.xser:
                    self._inline[name] = value
            else:
                raise CheckpointError(
                    f"rank file {self.path}: entry {name!r} is a {type(value).__name__}, not a tensor"
                )
        self._info = info

    def _mapped(self) -> dict:
        if not self.path.is_file():
            raise CheckpointError(
                f"rank file {self.path} is missing; the checkpoint is incomplete or was copied partially"
            )
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
        except (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"rank file {self.path} cannot be read ({first_line}); it may be truncated or corrupt"
            ) from None

    @property
    def names(self) -> list[str]:
        return list(self.shapes)

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The named tensors, backed by memory maps of the files while they are referenced."""
        missing = [name for name in names if name not in self.shapes]
        if missing:
            raise CheckpointError(f"rank file {self.path} has no tensor {missing[0]!r}")
        if self.xser:
            return {
                name: self._inline[name].clone()
                if name in self._inline
                else _load_reference(self.path, name, self._refs[name], self._info, mmap=True)
                for name in names
            }
        mapped = self._mapped()
        return {name: mapped[name] for name in names}
