"""A neuronx-distributed sharded adapter (neuron backend, tensor and pipeline parallel) -> its full tensors.

Each pipeline stage's TP rank files are read (xser or plain) and joined along the split axis its
metadata names (tp_layout). This is the one adapter form that needs torch to consolidate: a plain peft
adapter (torch backend) is checked and copied without it, so consolidate imports this module only for
a sharded adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.adapter_layout import ShardedAdapter
from llm_pipeline.weights.tp_layout import StageShards, consolidate_stage
from llm_pipeline.weights.xser_reader import load_rank_file


def read_metadata(path: Path, tp_size: int, rank_dir: Path, pp: int) -> dict:
    try:
        metadata = json.loads(path.read_text())
        parameters = metadata["parameters"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is not valid neuronx-distributed metadata ({exc})") from None
    expected = max(
        (p.get("num_partitions", 1) for p in parameters.values() if p.get("tensor_model_parallel")), default=1
    )
    if expected > tp_size:
        raise CheckpointError(
            f"rank file {rank_dir / f'dp_rank_00_tp_rank_{tp_size:02d}_pp_rank_{pp:02d}.pt'} is missing: {path.name} "
            f"describes TP={expected} but only {tp_size} rank file(s) exist"
        )
    return metadata


def consolidated_tensors(adapter: ShardedAdapter) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for pp, (metadata_file, rank_files) in enumerate(zip(adapter.metadata_files, adapter.rank_files, strict=True)):
        metadata = read_metadata(metadata_file, adapter.tp_size, rank_files[0].parent, pp)
        print(f"reading pipeline stage {pp}: {len(rank_files)} TP rank file(s) in {rank_files[0].parent}", flush=True)
        stage = StageShards(metadata=metadata, ranks=[load_rank_file(f) for f in rank_files], source=str(metadata_file))
        for name, tensor in consolidate_stage(stage, adapter.adapter_name).items():
            if name in tensors and tensors[name].shape != tensor.shape:
                raise CheckpointError(f"{name} differs between pipeline stages")
            tensors.setdefault(name, tensor)
    return tensors


def write_tensors(adapter: ShardedAdapter, weights_file: Path) -> None:
    """The adapter's full tensors, in name order, into one safetensors file."""
    tensors = {name: t.contiguous() for name, t in sorted(consolidated_tensors(adapter).items())}
    save_file(tensors, weights_file, metadata={"format": "pt"})
