"""Write checkpoints the way the trainers do: neuronx-distributed's sharded adapter layout (xser or
plain rank files, metadata, markers) and the transformers Trainer's plain peft checkpoint."""

from __future__ import annotations

import json
import pickle
import types
from collections.abc import Iterable
from pathlib import Path

import torch


class _XserReference:
    def __init__(self, tid: int) -> None:
        self.tid = tid


class _XserPickler(pickle._Pickler):
    """Pickles _XserReference under torch_xla's class name, as neuronx-distributed's files name it."""

    def save_global(self, obj, name=None):
        if obj is _XserReference:
            self.write(pickle.GLOBAL + b"torch_xla.utils.serialization\nTensorReference\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


_XSER_PICKLE = types.SimpleNamespace(Pickler=_XserPickler, __name__="pickle")


def save_rank_file(
    path: Path, tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *, xser: bool
) -> None:
    """One rank's file; in the xser form ``tensors`` may be a lazy (name, tensor) stream (one in memory at a time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    items = tensors.items() if isinstance(tensors, dict) else tensors
    if not xser:
        torch.save(dict(items), path)
        return
    folder = path.with_name(path.name + ".tensors")
    folder.mkdir(exist_ok=True)
    refs, info = {}, {}
    for tid, (name, tensor) in enumerate(items):
        torch.save(tensor, folder / f"tensor_{tid}.pt")
        refs[name] = _XserReference(tid)
        info[tid] = {"dtype": tensor.dtype, "shape": tensor.shape}
    torch.save(refs, path, pickle_module=_XSER_PICKLE)
    torch.save(info, path.with_name(path.name + ".info.pt"))


def pipeline_stages(
    ranks: list[dict[str, torch.Tensor]], metadata: dict, first_layer_of_stage_1: int
) -> list[tuple[list, dict]]:
    """Split one stage's files into two pipeline stages at a layer boundary (embeddings first, lm_head last)."""

    def stage_of(name: str) -> int:
        if ".layers." in name:
            return int(name.split(".layers.")[1].split(".")[0]) >= first_layer_of_stage_1
        return 1 if "lm_head" in name or name.endswith("model.norm.weight") else 0

    stages = []
    for stage in (0, 1):
        stage_ranks = [{k: v for k, v in tensors.items() if stage_of(k) == stage} for tensors in ranks]
        params = {k: v for k, v in metadata["parameters"].items() if stage_of(k) == stage}
        specs = [
            g
            for g in metadata["model_weight_transformation_specs"]
            if stage_of(g["module_fully_qualified_name"]) == stage
        ]
        stages.append((stage_ranks, {"parameters": params, "model_weight_transformation_specs": specs}))
    return stages


def write_sharded_checkpoint(
    checkpoint: Path,
    ranks: list[dict[str, torch.Tensor]],
    metadata: dict,
    config: dict,
    *,
    xser: bool,
    done: bool = True,
    stages: list[tuple[list, dict]] | None = None,
) -> Path:
    """checkpoint-N/ with adapter_default/adapter_shards/ laid out as neuronx-distributed saves it."""
    adapter = checkpoint / "adapter_default"
    shards = adapter / "adapter_shards"
    shards.mkdir(parents=True, exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (shards / "checkpoint").write_text("1")
    if done:
        (shards / "done").write_text("1")
    for pp, (stage_ranks, stage_metadata) in enumerate(stages or [(ranks, metadata)]):
        (shards / f"mp_metadata_pp_rank_{pp}.json").write_text(json.dumps(stage_metadata, indent=4))
        for rank, tensors in enumerate(stage_ranks):
            save_rank_file(shards / "model" / f"dp_rank_00_tp_rank_{rank:02d}_pp_rank_{pp:02d}.pt", tensors, xser=xser)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": int(checkpoint.name.split("-")[-1])}))
    return checkpoint


def write_plain_checkpoint(checkpoint: Path, adapter: dict[str, torch.Tensor], config: dict) -> Path:
    """checkpoint-N/ as the transformers Trainer saves a peft model (torch backend)."""
    from safetensors.torch import save_file

    checkpoint.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in adapter.items()},
        checkpoint / "adapter_model.safetensors",
        metadata={"format": "pt"},
    )
    (checkpoint / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": int(checkpoint.name.split("-")[-1])}))
    return checkpoint


def run_config(tmp: Path, output_dir: Path, model_dir: Path | None = None) -> Path:
    """A run config TOML whose paths point into the test's folders."""
    path = tmp / "run.toml"
    lines = ["[paths]", f'output_dir = "{output_dir}"']
    if model_dir is not None:
        lines.append(f'model_dir = "{model_dir}"')
    path.write_text("\n".join(lines) + "\n")
    return path
