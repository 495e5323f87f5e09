"""Read one neuronx-distributed rank file, in the xser form or the plain form, without torch_xla.

Plain form: ``dp_rank_00_tp_rank_TT_pp_rank_PP.pt`` is a ``torch.save``d ``{name: tensor}`` dict.
xser form (optimum-neuron's default, ``use_xser=True``): that file holds the same dict with each
tensor replaced by a ``torch_xla.utils.serialization.TensorReference(tid)``; tensor ``tid`` is
``<file>.tensors/tensor_<tid>.pt`` and ``<file>.info.pt`` records every tid's dtype and shape.
Unpickling maps that torch_xla class to a small stand-in, inside torch's weights-only unpickler,
so reading never runs code from the checkpoint and never needs torch_xla.
"""

from __future__ import annotations

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


def _load(path: Path, what: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{what} {path} is missing; the checkpoint is incomplete or was copied partially")
    try:
        with torch.serialization.safe_globals([(TensorReference, XSER_REFERENCE)]):
            return torch.load(path, map_location="cpu", weights_only=True)
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


def _load_reference(path: Path, name: str, ref: TensorReference, info: dict) -> torch.Tensor:
    tensor_file = path.with_name(path.name + ".tensors") / f"tensor_{ref.tid}.pt"
    tensor = _load(tensor_file, f"xser tensor file for {name!r}:")
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"xser tensor file {tensor_file} does not hold a tensor")
    expected = info.get(ref.tid) or {"dtype": ref.dtype, "shape": ref.shape}
    for key, actual in (("dtype", tensor.dtype), ("shape", tuple(tensor.shape))):
        want = expected.get(key)
        if want is not None and (tuple(want) if key == "shape" else want) != actual:
            raise CheckpointError(
                f"xser tensor file {tensor_file} for {name!r} has {key} {actual}, but {path.name}.info.pt says {want}"
            )
    return tensor
