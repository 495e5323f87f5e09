"""Write a Hugging Face model's safetensors shards one tensor at a time, in any order.

Every tensor's name, shape and dtype are known before any value is (full_layout plans them), so
each shard's header is written first and each tensor lands at its own offset with ``os.pwrite``:
memory holds the tensor being written, never a shard. Shards are cut like ``save_pretrained`` cuts
them (tensors in order, a new shard once the next tensor would pass the limit), named
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``, or one
``model.safetensors`` when everything fits in one.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.full_layout import OutputTensor
from llm_pipeline.weights.model_files import INDEX_NAME, SINGLE_NAME

MAX_SHARD_BYTES = 5 * 10**9  # save_pretrained's default max_shard_size ("5GB")
CODES = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
WRITE_CHUNK = 1 << 30  # one pwrite moves at most ~2 GB on Linux
IOV_MAX = 1024  # buffers per pwritev on Linux


@dataclass
class ShardPlan:
    file_name: str
    tensors: list[OutputTensor]
    header: bytes = b""
    offsets: dict[str, int] = field(default_factory=dict)  # absolute byte offset of each tensor


def _header(tensors: list[OutputTensor]) -> tuple[bytes, dict[str, int]]:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    relative, position = {}, 0
    for tensor in tensors:
        if tensor.dtype not in CODES:
            raise CheckpointError(f"{tensor.name} has dtype {tensor.dtype}, which safetensors cannot hold")
        entries[tensor.name] = {
            "dtype": CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [position, position + tensor.nbytes],
        }
        relative[tensor.name] = position
        position += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
    header = struct.pack("<Q", len(text)) + text
    return header, {name: len(header) + offset for name, offset in relative.items()}


def plan_shards(tensors: list[OutputTensor], max_bytes: int = MAX_SHARD_BYTES) -> list[ShardPlan]:
    groups: list[list[OutputTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if groups[-1] and size + tensor.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.nbytes
    names = (
        [SINGLE_NAME]
        if len(groups) == 1
        else [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    )
    plans = [ShardPlan(name, group) for name, group in zip(names, groups, strict=True)]
    for plan in plans:
        plan.header, plan.offsets = _header(plan.tensors)
    return plans


class ShardedWriter:
    """Open every planned shard, write headers; ``write`` puts one tensor in place; ``close`` checks and indexes."""

    def __init__(self, folder: Path, plans: list[ShardPlan]) -> None:
        self.folder, self.plans = Path(folder), plans
        self._where = {t.name: (plan, t) for plan in plans for t in plan.tensors}
        self._written: set[str] = set()
        self._fds: dict[str, int] = {}
        for plan in plans:
            fd = os.open(self.folder / plan.file_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._fds[plan.file_name] = fd
            _pwrite_all(fd, memoryview(plan.header), 0)

    def wants(self, name: str) -> bool:
        return name in self._where

    def write(self, name: str, blocks: list[torch.Tensor]) -> int:
        """Write a tensor given as row blocks (concatenated along dim 0 they make it), in one gathered write."""
        plan, expected = self._where[name]
        rows = sum(block.shape[0] if block.dim() else 1 for block in blocks)
        trailing = {tuple(block.shape[1:]) for block in blocks}
        dtypes = {block.dtype for block in blocks}
        shape = (rows, *next(iter(trailing))) if len(trailing) == 1 and expected.shape else tuple(blocks[0].shape)
        if len(trailing) != 1 or dtypes != {expected.dtype} or shape != expected.shape:
            got = [list(block.shape) for block in blocks[:3]] + (["..."] if len(blocks) > 3 else [])
            raise CheckpointError(
                f"{name} was rebuilt from blocks {got} of {sorted(map(str, dtypes))}; "
                f"the plan expected {list(expected.shape)} {expected.dtype}"
            )
        buffers = [memoryview(block.contiguous().reshape(-1).view(torch.uint8).numpy()) for block in blocks]
        _pwritev_all(self._fds[plan.file_name], buffers, plan.offsets[name])
        self._written.add(name)
        return expected.nbytes

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        missing = sorted(set(self._where) - self._written)
        if missing:
            raise CheckpointError(f"{len(missing)} planned tensors were never written (e.g. {missing[0]})")
        if len(self.plans) > 1:
            index = {
                "metadata": {"total_size": sum(t.nbytes for plan in self.plans for t in plan.tensors)},
                "weight_map": {t.name: plan.file_name for plan in self.plans for t in plan.tensors},
            }
            (self.folder / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def abort(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _pwritev_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    """Write the buffers one after the other from ``offset``, in as few system calls as the kernel allows."""
    pending = [b for b in buffers if len(b)]
    while pending:
        batch, size = [], 0
        while pending and len(batch) < IOV_MAX and size + len(pending[0]) <= WRITE_CHUNK:
            size += len(pending[0])
            batch.append(pending.pop(0))
        if not batch:  # one buffer larger than a call may move
            large = pending.pop(0)
            _pwrite_all(fd, large, offset)
            offset += len(large)
            continue
        written = os.pwritev(fd, batch, offset)
        if written < size:  # a short write: finish what is left of this batch
            remainder = b"".join(bytes(b) for b in batch)[written:]
            _pwrite_all(fd, memoryview(remainder), offset + written)
        offset += size


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        written = os.pwrite(fd, data[done : done + WRITE_CHUNK], offset + done)
        if written <= 0:
            raise OSError(f"short write at byte {offset + done}")
        done += written
