"""Stream one safetensors shard to a merged copy: unchanged bytes are copied, LoRA targets rewritten.

The output shard has the input's header byte for byte (a merge changes values, never names,
shapes or dtypes), so every tensor sits at the same offset in both files. Bytes between LoRA
targets are moved with ``os.copy_file_range`` (kernel side, no Python buffers); each target is
rewritten in row blocks: W' = W + scale * B @ A in fp32, cast back to W's dtype. Memory is bounded
by one row block, whatever the model size.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from .adapter_files import AdapterFolder, LoraUpdate
from .safetensors_header import SafetensorsFile, TensorSlot

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
BLOCK_BYTES = 64 * 1024 * 1024  # fp32 bytes of W per row block
COPY_CHUNK = 256 * 1024 * 1024

Progress = Callable[[int], None]  # called with bytes done in the current shard


class LoraFactors:
    """The A/B factors of every update, loaded once in fp32 (they are small), plus base copies."""

    def __init__(self, adapter: AdapterFolder) -> None:
        self._handle = safe_open(str(adapter.weights_file), framework="pt")
        self.scale = adapter.scale
        self.factors = {
            target: (self._handle.get_tensor(u.a_key).float(), self._handle.get_tensor(u.b_key).float())
            for target, u in adapter.updates.items()
        }

    def base_rows(self, update: LoraUpdate, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        """Rows of the full base weight saved in the adapter (embedding layers), in W's dtype."""
        return self._handle.get_slice(update.base_copy_key)[rows].to(dtype)

    def delta_rows(self, update: LoraUpdate, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(left, right) with left @ right == (B @ A)[rows] (linear) or ((B @ A).T)[rows] (embedding)."""
        a, b = self.factors[update.target]
        if update.kind == "embedding":
            return a[:, rows].T, b.T
        return b[rows], a


def copy_range(src: int, dst: int, start: int, end: int, progress: Progress, base: int) -> None:
    """Copy bytes [start, end) of src to the same offsets of dst."""
    offset = start
    while offset < end:
        count = min(COPY_CHUNK, end - offset)
        try:
            copied = os.copy_file_range(src, dst, count, offset, offset)
        except OSError:  # file systems without copy_file_range
            data = os.pread(src, count, offset)
            copied = os.pwrite(dst, data, offset)
        if copied <= 0:
            raise OSError(f"short copy at byte {offset}")
        offset += copied
        progress(offset - base)


def merge_slot(src: int, dst: int, slot: TensorSlot, update: LoraUpdate, lora: LoraFactors) -> None:
    """Rewrite one target tensor block by block."""
    dtype = TORCH_DTYPES[slot.dtype]
    rows_total = slot.shape[0]
    row_elems = slot.nbytes // (rows_total * dtype.itemsize)
    block_rows = max(1, BLOCK_BYTES // (row_elems * 4))
    for first in range(0, rows_total, block_rows):
        rows = slice(first, min(first + block_rows, rows_total))
        count = rows.stop - rows.start
        offset = slot.start + first * row_elems * dtype.itemsize
        if update.base_copy_key is not None:
            weight = lora.base_rows(update, rows, dtype).reshape(count, row_elems)
        else:
            raw = bytearray(count * row_elems * dtype.itemsize)
            if os.preadv(src, [raw], offset) != len(raw):
                raise OSError(f"short read of {slot.name}")
            weight = torch.frombuffer(raw, dtype=dtype).view(count, row_elems)
        left, right = lora.delta_rows(update, rows)
        compute = torch.promote_types(dtype, torch.float32)  # fp32, or fp64 for an fp64 base
        merged = weight.to(compute).addmm_(left.to(compute), right.to(compute), alpha=lora.scale).to(dtype)
        os.pwrite(dst, merged.view(torch.uint8).numpy().data, offset)


def merge_shard(
    shard: SafetensorsFile, out_path: Path, lora: LoraFactors, updates: dict[str, LoraUpdate], progress: Progress
) -> list[str]:
    """Write the merged copy of ``shard``; returns the names of the tensors it rewrote."""
    merged = []
    with shard.path.open("rb") as src_file, out_path.open("wb") as dst_file:
        src, dst = src_file.fileno(), dst_file.fileno()
        os.pwrite(dst, shard.header, 0)
        position = shard.data_start
        for slot in sorted(shard.tensors.values(), key=lambda s: s.start):
            update = updates.get(slot.name)
            if update is None:
                continue
            copy_range(src, dst, position, slot.start, progress, shard.data_start)
            merge_slot(src, dst, slot, update, lora)
            merged.append(slot.name)
            position = slot.end
            progress(position - shard.data_start)
        copy_range(src, dst, position, shard.size, progress, shard.data_start)
    return merged


class ProgressPrinter:
    """Prints a shard's progress at most every few seconds (long shards on slow disks)."""

    def __init__(self, label: str, total: int, every_s: float = 5.0) -> None:
        self.label, self.total, self.every_s = label, total, every_s
        self.started = self._last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            print(f"  {self.label}: {done / 1e9:.2f}/{self.total / 1e9:.2f} GB", flush=True)
