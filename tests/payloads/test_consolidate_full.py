"""Full-weight consolidation: a tiny GQA Llama sharded like optimum-neuron 0.4.5 saves it (TP 2/4/8,
xser and plain, fused qkv) comes back as the exact Hugging Face model folder; the shard layout is
checked against optimum-neuron's own consolidation code; bad inputs stop clearly."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from full_fixtures import shard_full_model, write_full_checkpoint
from nxd_files import run_config
from safetensors import safe_open
from safetensors.torch import load_file

from llm_pipeline import consolidate
from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.full_checkpoint import find_full_checkpoint
from llm_pipeline.weights.full_layout import OutputTensor
from llm_pipeline.weights.safetensors_writer import ShardedWriter, plan_shards
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks

# name: (KV heads, TP, fuse_qkv); the tiny model has 8 query heads
CASES = {
    "tp2-split-qkv": (2, 2, False),
    "tp4-gqa-kv-x2": (2, 4, False),
    "tp8-gqa-kv-x4": (2, 8, False),
    "tp8-gqa-fused-qkv": (2, 8, True),
    "tp2-mha-fused-qkv": (8, 2, True),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, Path]:
    """Tiny bf16 Llamas with 8 query heads and 2 or 8 KV heads (vocab 104: splits over TP 8)."""
    root = tmp_path_factory.mktemp("full-models")
    return {kv: tiny.write_tiny_model(root / f"kv{kv}", dtype="bfloat16", heads=8, kv_heads=kv) for kv in (2, 8)}


def hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def sharded_checkpoint(tmp_path: Path, model_dir: Path, tp: int, fuse_qkv: bool, *, xser: bool, step: int = 20):
    config = json.loads((model_dir / "config.json").read_text())
    ranks, metadata = shard_full_model(hf_state(model_dir), config, tp, fuse_qkv=fuse_qkv)
    checkpoint = tmp_path / "run" / "checkpoints" / f"checkpoint-{step}"
    # xser: model only, as the neuron engine saves (save_only_model); plain .pt: with the ZeRO-1 optimizer files
    written = write_full_checkpoint(checkpoint, model_dir, ranks, metadata, xser=xser, with_optimizer=not xser)
    return written, ranks, metadata


def consolidated(checkpoint: Path, output: Path, base: Path | None = None) -> Path:
    full = find_full_checkpoint(checkpoint)
    assert full is not None
    return consolidate.consolidate_full_checkpoint(full, output, base=base)


@pytest.mark.parametrize("xser", [True, False], ids=["xser", "plain-pt"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_is_exact(tmp_path, models, case, xser):
    kv_heads, tp, fuse_qkv = CASES[case]
    base = models[kv_heads]
    checkpoint, _, _ = sharded_checkpoint(tmp_path, base, tp, fuse_qkv, xser=xser)
    assert (checkpoint / "shards" / "optim").is_dir() == (not xser)
    out = consolidated(checkpoint, tmp_path / "merged", base=base)
    original, rebuilt = hf_state(base), load_file(out / "model.safetensors")
    assert sorted(rebuilt) == sorted(original)
    for name, tensor in original.items():
        assert rebuilt[name].dtype == torch.bfloat16 and torch.equal(rebuilt[name], tensor), name
    assert json.loads((out / "config.json").read_text())["num_key_value_heads"] == kv_heads
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    assert not (out / "trn_config.json").exists() and not list(tmp_path.glob(".merged.partial*"))


def test_the_folder_loads_in_transformers_and_generates_like_the_original(tmp_path, models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint, _, _ = sharded_checkpoint(tmp_path, models[2], 8, False, xser=True)
    out = consolidated(checkpoint, tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("a llama and an alpaca", return_tensors="pt").input_ids
    logits = [AutoModelForCausalLM.from_pretrained(m).eval()(ids).logits for m in (models[2], out)]
    assert torch.equal(logits[0], logits[1])


def test_large_models_are_cut_into_indexed_shards(tmp_path):
    tensors = {f"layer.{i}.weight": torch.randn(64, 32).to(torch.bfloat16) for i in range(5)}
    plans = plan_shards([OutputTensor(n, tuple(t.shape), t.dtype) for n, t in tensors.items()], max_bytes=8192)
    writer = ShardedWriter(tmp_path, plans)
    for name in reversed(list(tensors)):  # any order: each tensor has its place; rows may come in blocks
        writer.write(name, list(tensors[name].split(24)))
    writer.close()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(plans) == 3 and sorted(set(index["weight_map"].values())) == [p.file_name for p in plans]
    assert index["metadata"]["total_size"] == 5 * 64 * 32 * 2
    for name, file in index["weight_map"].items():
        with safe_open(str(tmp_path / file), "pt") as handle:
            assert torch.equal(handle.get_tensor(name), tensors[name])


def test_a_tensor_never_written_is_an_error(tmp_path):
    plans = plan_shards([OutputTensor("a", (2,), torch.float32), OutputTensor("b", (2,), torch.float32)])
    writer = ShardedWriter(tmp_path, plans)
    writer.write("a", [torch.zeros(2)])
    with pytest.raises(CheckpointError, match="never written"):
        writer.close()


def test_step_cli_given_a_checkpoints_folder_merges_its_newest_complete_checkpoint(tmp_path, models, capsys):
    base = models[2]
    sharded_checkpoint(tmp_path, base, 4, False, xser=True, step=10)
    newer, _, _ = sharded_checkpoint(tmp_path, base, 4, False, xser=True, step=20)
    (newer / "shards" / "done").unlink()  # an interrupted save: consolidation falls back to checkpoint-10
    config = run_config(tmp_path, tmp_path / "run", base)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert consolidate.main(["--config", str(config), "--checkpoint", str(checkpoints)]) == 0
    assert "checkpoint-20 is incomplete; using checkpoint-10" in capsys.readouterr().out
    merged = tmp_path / "run" / "merged"
    assert sorted(load_file(merged / "model.safetensors")) == sorted(hf_state(base))


def test_rank_file_missing_is_named(tmp_path, models):
    checkpoint, _, _ = sharded_checkpoint(tmp_path, models[2], 4, False, xser=False)
    (checkpoint / "shards/model/dp_rank_00_tp_rank_02_pp_rank_00.pt").unlink()
    with pytest.raises(CheckpointError, match=r"tp_rank_02_pp_rank_00\.pt is missing"):
        find_full_checkpoint(checkpoint)


def test_a_model_that_does_not_match_the_base_is_refused_and_nothing_is_written(tmp_path, models):
    checkpoint, _, _ = sharded_checkpoint(tmp_path, models[2], 2, False, xser=True)
    with pytest.raises(CheckpointError, match="does not match the base model"):
        consolidated(checkpoint, tmp_path / "merged", base=models[8])
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".merged.partial*"))


def test_a_lora_checkpoint_is_not_mistaken_for_a_full_one(tmp_path, models):
    checkpoint, _, metadata = sharded_checkpoint(tmp_path, models[2], 2, False, xser=False)
    metadata["parameters"]["model.layers.0.self_attn.q_proj.lora_A.default.weight"] = {"tensor_model_parallel": False}
    (checkpoint / "shards/mp_metadata_pp_rank_0.json").write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match="LoRA tensor"):
        consolidated(checkpoint, tmp_path / "merged")


# optimum-neuron's own consolidation, run on our fixture's rank files: the writer matches upstream.


def upstream_transformations(tp: int) -> types.ModuleType:
    """optimum-neuron 0.4.5's transformations_utils, compiled from the installed source with the
    neuronx-distributed TP queries bound to fixed values (the module itself needs torch_xla)."""
    package = Path(importlib.util.find_spec("optimum.neuron").submodule_search_locations[0])
    tree = ast.parse((package / "models/training/transformations_utils.py").read_text())
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("neuronx_distributed")))
    ]
    module = types.ModuleType("upstream_transformations_utils")
    module.__dict__.update(
        get_tensor_model_parallel_size=lambda: tp,
        get_tensor_model_parallel_rank=lambda: 0,
        create_local_weight=None,
        is_peft_available=lambda: False,
    )
    sys.modules[module.__name__] = module  # from_metadata looks its spec classes up there
    exec(compile(tree, "transformations_utils.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("case", ["tp8-gqa-kv-x4", "tp8-gqa-fused-qkv", "tp2-mha-fused-qkv", "tp4-gqa-kv-x2"])
@pytest.mark.trn1
def test_upstream_consolidation_of_our_fixture_gives_the_original_model(models, case):
    kv_heads, tp, fuse_qkv = CASES[case]
    state = hf_state(models[kv_heads])
    config = json.loads((models[kv_heads] / "config.json").read_text())
    ranks, metadata = shard_full_model(state, config, tp, fuse_qkv=fuse_qkv)
    upstream = upstream_transformations(tp)
    try:
        specs = [
            upstream.ModelWeightTransformationSpecs.from_metadata(copy.deepcopy(group))
            for group in metadata["model_weight_transformation_specs"]
        ]
        sharded = {name: [r[name] for r in ranks] for name in ranks[0]}
        rebuilt = upstream.to_original_weights(specs, sharded, metadata["parameters"])
    finally:
        del sys.modules[upstream.__name__]
    assert sorted(rebuilt) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(rebuilt[name], tensor), name
