"""Read and check safetensors headers without loading tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw bytes. Reading only the header lets the merge copy
unchanged tensors byte for byte and find the ones it changes; checking every range against the
file size catches a truncated or corrupt file before anything is written.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import CheckpointError

# safetensors dtype code -> bytes per element
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsFile:
    path: Path
    header: bytes  # the length prefix and JSON header, exactly as on disk
    tensors: dict[str, TensorSlot]
    size: int

    @property
    def data_start(self) -> int:
        return len(self.header)


def read_header(path: Path) -> SafetensorsFile:
    """Parse and check one file; every problem names the file and what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path} is truncated ({size} bytes): not a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(
                    f"{path} is truncated or not a safetensors file (header length {length}, file {size} bytes)"
                )
            header_json = handle.read(length)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        entries = json.loads(header_json)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} has a corrupt safetensors header: {exc}") from None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header (not a JSON object)")
    data_start = 8 + length
    tensors: dict[str, TensorSlot] = {}
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        tensors[name] = _slot(path, name, entry, data_start)
    data_end = max((slot.end for slot in tensors.values()), default=data_start)
    if data_end > size:
        raise CheckpointError(
            f"{path} is truncated: its header describes {data_end} bytes but the file has {size}; "
            "copy or download it again"
        )
    return SafetensorsFile(path=path, header=prefix + header_json, tensors=tensors, size=size)


def _slot(path: Path, name: str, entry: object, data_start: int) -> TensorSlot:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]  # type: ignore[index]
        itemsize = DTYPE_SIZES[dtype]
        ok = all(isinstance(d, int) and d >= 0 for d in shape) and 0 <= begin <= end
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: header entry for {name!r} is malformed ({entry!r})") from None
    if not ok or end - begin != math.prod(shape) * itemsize:
        raise CheckpointError(f"{path}: header entry for {name!r} is inconsistent ({entry!r})")
    return TensorSlot(name, dtype, shape, data_start + begin, data_start + end)
