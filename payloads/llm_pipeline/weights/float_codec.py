"""Float tensors as raw bytes <-> numpy arrays, bfloat16 included, without torch.

numpy has no bfloat16, but bf16 is the top half of an fp32: widening is a 16-bit shift, and
narrowing rounds to nearest-even on the dropped half (NaN becomes the canonical 0x7FC0), exactly
as torch casts. Keeping torch out of the merge saves a second and 200 MB of start-up.
"""

from __future__ import annotations

import numpy as np

NUMPY_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def compute_type(code: str) -> type:
    """fp32 for 16/32-bit weights, fp64 for fp64 weights."""
    return np.float64 if code == "F64" else np.float32


def decode(raw: np.ndarray | bytes | bytearray, code: str) -> np.ndarray:
    """Little-endian safetensors bytes -> a new fp32 (or fp64) array."""
    if code == "BF16":
        halves = np.frombuffer(raw, np.uint16)
        widened = np.empty(halves.shape, np.uint32)
        np.left_shift(halves, 16, out=widened, dtype=np.uint32)  # shift in 32 bits, one pass
        return widened.view(np.float32)
    return np.frombuffer(raw, NUMPY_TYPES[code]).astype(compute_type(code))


def encode(values: np.ndarray, code: str) -> np.ndarray:
    """fp32/fp64 values -> an array whose bytes are the tensor in ``code``. Overwrites ``values`` (bf16)."""
    if code != "BF16":
        with np.errstate(over="ignore"):  # beyond the format's range becomes inf, as in torch
            return values.astype(NUMPY_TYPES[code])
    values = np.ascontiguousarray(values, dtype=np.float32)
    nan = np.isnan(values) if np.isnan(values.max(initial=0.0)) else None  # max() is a cheap NaN probe
    bits = values.view(np.uint32)
    rounding = bits >> 16  # round to nearest, ties to even: add 0x7FFF plus the kept part's lowest bit
    rounding &= 1
    rounding += 0x7FFF
    bits += rounding
    narrowed = np.empty(bits.shape, np.uint16)
    np.right_shift(bits, 16, out=narrowed, casting="unsafe")
    if nan is not None:
        narrowed[nan] = 0x7FC0
    return narrowed
