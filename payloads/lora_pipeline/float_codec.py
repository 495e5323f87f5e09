"""Float tensors as raw bytes <-> numpy arrays, bfloat16 included, without torch.

numpy has no bfloat16, but bf16 is the top half of an fp32: widening is a 16-bit shift, and
narrowing rounds to nearest-even on the dropped half (NaN becomes the canonical 0x7FC0), exactly
as torch casts. Keeping torch out of the merge saves a second and 200 MB of start-up.
"""

from __future__ import annotations

import numpy as np

NUMPY_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")


def compute_type(code: str) -> type:
    """fp32 for 16/32-bit weights, fp64 for fp64 weights."""
    return np.float64 if code == "F64" else np.float32


def decode(raw: bytes | bytearray | memoryview, code: str) -> np.ndarray:
    """Little-endian safetensors bytes -> a new fp32 (or fp64) array."""
    if code == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, NUMPY_TYPES[code]).astype(compute_type(code))


def encode(values: np.ndarray, code: str) -> np.ndarray:
    """fp32/fp64 values -> an array whose bytes are the tensor in ``code``."""
    if code != "BF16":
        with np.errstate(over="ignore"):  # beyond the format's range becomes inf, as in torch
            return values.astype(NUMPY_TYPES[code])
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded
