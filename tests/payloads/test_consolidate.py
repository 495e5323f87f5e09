"""consolidate: sharded adapters (both file forms, TP 2/4/8, GQA) rebuild exactly; bad inputs stop clearly."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from merge_fixtures import ATTENTION, MLP, Shape, adapter_config, full_adapter, shard_adapter
from nxd_files import pipeline_stages, run_config, write_plain_checkpoint, write_sharded_checkpoint
from safetensors.torch import load_file

from llm_pipeline import consolidate
from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.tp_layout import join_shards

pytestmark = pytest.mark.both_stacks

EVERYTHING = (*ATTENTION, *MLP, "embed_tokens", "lm_head")
CASES = {
    # name: (shape, TP, targets, fuse_qkv)
    "tp2-default-qv": (Shape(), 2, ("q_proj", "v_proj"), False),
    "tp4-all-modules": (Shape(), 4, EVERYTHING, False),
    "tp8-all-modules": (Shape(), 8, EVERYTHING, False),
    "gqa-tp4-kv-replicated": (Shape(kv_heads=2), 4, (*ATTENTION, *MLP), False),
    "gqa-tp8-fused-qkv": (Shape(kv_heads=2), 8, (*ATTENTION, "lm_head"), True),
    "gqa-tp8-o-and-mlp-only": (Shape(kv_heads=2), 8, ("o_proj", *MLP), False),
    # Llama 3 8B's ratio (32 heads, 8 KV heads) at TP 16: q/k/v fused into qkv_proj, KV heads x2.
    "gqa-tp16-llama3-ratio": (Shape(hidden=64, heads=32, kv_heads=8), 16, ("q_proj", "k_proj", "v_proj"), False),
}


def sharded(tmp_path, case: str, *, xser: bool = True, step: int = 10):
    shape, tp, targets, fuse_qkv = CASES[case]
    full = full_adapter(shape, targets)
    ranks, metadata = shard_adapter(shape, full, tp, fuse_qkv=fuse_qkv)
    checkpoint = write_sharded_checkpoint(
        tmp_path / "run" / "checkpoints" / f"checkpoint-{step}", ranks, metadata, adapter_config(targets), xser=xser
    )
    return full, checkpoint


@pytest.mark.parametrize("xser", [True, False], ids=["xser", "plain-pt"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_is_exact(tmp_path, case, xser):
    full, checkpoint = sharded(tmp_path, case, xser=xser)
    out = consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    rebuilt = load_file(out / "adapter_model.safetensors")
    assert sorted(rebuilt) == sorted(full)
    for name, tensor in full.items():
        assert torch.equal(rebuilt[name], tensor), name
    config = json.loads((out / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == set(CASES[case][2]) and config["inference_mode"] is True


def test_default_targets_skip_the_untargeted_fused_mlp_spec(tmp_path):
    # The metadata lists the MLP's FusedLinearsSpec even though only q/v carry LoRA (the case
    # upstream's consolidation stumbles on); its tensors are absent, so it is skipped.
    full, checkpoint = sharded(tmp_path, "tp2-default-qv")
    metadata = json.loads(next(checkpoint.rglob("mp_metadata_pp_rank_0.json")).read_text())
    assert any(s[0] == "FusedLinearsSpec" for g in metadata["model_weight_transformation_specs"] for s in g["specs"])
    out = consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    assert sorted(load_file(out / "adapter_model.safetensors")) == sorted(full)


def test_two_pipeline_stages_rebuild_exactly(tmp_path):
    shape, tp, targets, _ = CASES["tp4-all-modules"]
    full = full_adapter(shape, targets)
    ranks, metadata = shard_adapter(shape, full, tp)
    checkpoint = write_sharded_checkpoint(
        tmp_path / "checkpoint-7",
        ranks,
        metadata,
        adapter_config(targets),
        xser=True,
        stages=pipeline_stages(ranks, metadata, 1),
    )
    assert (checkpoint / "adapter_default/adapter_shards/model/dp_rank_00_tp_rank_03_pp_rank_01.pt").is_file()
    rebuilt = load_file(
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter") / "adapter_model.safetensors"
    )
    assert sorted(rebuilt) == sorted(full) and all(torch.equal(rebuilt[k], v) for k, v in full.items())


def test_strided_split_interleaves_blocks_like_the_fused_gate_up():
    # gate_up_proj's base layer is split with partition_stride 2: each rank holds its gate block,
    # then its up block. Joining with that stride gives [gate; up] back.
    gate, up = torch.randn(16, 3), torch.randn(16, 3)
    pieces = [torch.cat([g, u]) for g, u in zip(gate.chunk(4), up.chunk(4), strict=True)]
    info = {"tensor_model_parallel": True, "partition_dim": 0, "partition_stride": 2, "num_partitions": 4}
    assert torch.equal(join_shards("gate_up_proj.weight", pieces, info), torch.cat([gate, up]))
    assert torch.equal(join_shards("x", pieces, {**info, "partition_stride": 1}), torch.cat(pieces))


def test_cli_given_a_checkpoints_folder_picks_its_newest_complete_checkpoint(tmp_path, capsys):
    full, _ = sharded(tmp_path, "tp2-default-qv", step=10)
    _, newer = sharded(tmp_path, "tp4-all-modules", step=20)
    (newer / "adapter_default" / "adapter_shards" / "done").unlink()  # a save that never finished
    config = run_config(tmp_path, tmp_path / "run")
    checkpoints = tmp_path / "run" / "checkpoints"
    assert consolidate.main(["--config", str(config), "--checkpoint", str(checkpoints)]) == 0
    assert "checkpoint-20 is incomplete; using checkpoint-10" in capsys.readouterr().out
    assert consolidate.main(["--config", str(config), "--overwrite"]) == 2  # by default: the finished one only
    assert f"{checkpoints}: training has not finished" in capsys.readouterr().err
    assert sorted(load_file(tmp_path / "run" / "adapter" / "adapter_model.safetensors")) == sorted(full)


def test_plain_peft_checkpoint_passes_through(tmp_path):
    full = full_adapter(Shape(), ("q_proj", "v_proj"), share_a=False)
    checkpoint = write_plain_checkpoint(
        tmp_path / "checkpoints" / "checkpoint-3", full, adapter_config(("q_proj", "v_proj"))
    )
    out = consolidate.consolidate_checkpoint(tmp_path / "checkpoints", tmp_path / "adapter")
    assert (out / "adapter_model.safetensors").read_bytes() == (checkpoint / "adapter_model.safetensors").read_bytes()


def test_truncated_plain_adapter_is_refused(tmp_path):
    full = full_adapter(Shape(), ("q_proj", "v_proj"), share_a=False)
    checkpoint = write_plain_checkpoint(tmp_path / "checkpoint-3", full, adapter_config(("q_proj", "v_proj")))
    weights = checkpoint / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors is truncated"):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_missing_rank_file_is_named(tmp_path):
    _, checkpoint = sharded(tmp_path, "tp4-all-modules")
    model = checkpoint / "adapter_default" / "adapter_shards" / "model"
    (model / "dp_rank_00_tp_rank_01_pp_rank_00.pt").unlink()
    with pytest.raises(CheckpointError, match=r"dp_rank_00_tp_rank_01_pp_rank_00\.pt is missing"):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    for path in model.glob("dp_rank_00_tp_rank_03_pp_rank_00.pt*"):  # the last rank: only the metadata can tell
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (model / "dp_rank_00_tp_rank_01_pp_rank_00.pt").touch()
    with pytest.raises(CheckpointError, match=r"tp_rank_01_pp_rank_00.pt cannot be read|describes TP=4"):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")


def test_last_rank_missing_is_caught_by_the_metadata(tmp_path):
    _, checkpoint = sharded(tmp_path, "tp4-all-modules", xser=False)
    (checkpoint / "adapter_default" / "adapter_shards" / "model" / "dp_rank_00_tp_rank_03_pp_rank_00.pt").unlink()
    with pytest.raises(CheckpointError, match=r"dp_rank_00_tp_rank_03_pp_rank_00.pt is missing: .*describes TP=4"):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("drop-parameter", "which the metadata does not describe"),
        ("wrong-partitions", "splits .* in 2 parts but there are 4 TP rank files"),
        ("wrong-spec-tp", "says TP=2, files say TP=4"),
        ("wrong-fused-dims", "the spec implies"),
    ],
)
def test_metadata_disagreeing_with_files(tmp_path, edit, message):
    _, checkpoint = sharded(tmp_path, "tp4-all-modules")
    path = checkpoint / "adapter_default" / "adapter_shards" / "mp_metadata_pp_rank_0.json"
    metadata = json.loads(path.read_text())
    params, specs = metadata["parameters"], metadata["model_weight_transformation_specs"]
    q_lora_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    if edit == "drop-parameter":
        del params[q_lora_b]
    elif edit == "wrong-partitions":
        params[q_lora_b]["num_partitions"] = 2
    elif edit == "wrong-spec-tp":
        specs[1]["specs"][0][1]["tp_size"] = 2
    else:
        specs[1]["specs"][0][1]["original_dims"] = [64, 64]
    path.write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=message):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")


@pytest.mark.parametrize("victim", ["rank-file", "xser-tensor", "xser-info"])
def test_truncated_or_missing_files(tmp_path, victim):
    _, checkpoint = sharded(tmp_path, "gqa-tp4-kv-replicated")
    rank_file = checkpoint / "adapter_default" / "adapter_shards" / "model" / "dp_rank_00_tp_rank_02_pp_rank_00.pt"
    if victim == "rank-file":
        rank_file.write_bytes(rank_file.read_bytes()[:100])
        message = "tp_rank_02_pp_rank_00.pt cannot be read"
    elif victim == "xser-tensor":
        tensor = rank_file.with_name(rank_file.name + ".tensors") / "tensor_1.pt"
        tensor.write_bytes(tensor.read_bytes()[:-40])
        message = "tensor_1.pt cannot be read"
    else:
        (rank_file.with_name(rank_file.name + ".tensors") / "tensor_0.pt").unlink()
        message = "tensor_0.pt is missing"
    with pytest.raises(CheckpointError, match=message):
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")


def test_cli_refuses_a_non_empty_output_folder(tmp_path, capsys):
    _, checkpoint = sharded(tmp_path, "tp2-default-qv")
    output = tmp_path / "adapter"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    config = run_config(tmp_path, tmp_path / "run")
    assert consolidate.main(["--config", str(config), "--checkpoint", str(checkpoint), "--output", str(output)]) == 2
    assert "error: output folder" in capsys.readouterr().err and (output / "keep.txt").read_text() == "mine"
    assert (
        consolidate.main(
            ["--config", str(config), "--checkpoint", str(checkpoint), "--output", str(output), "--overwrite"]
        )
        == 0
    )
    assert not (output / "keep.txt").exists() and (output / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".adapter")) == []


@pytest.mark.parametrize("layout", ["nothing", "full-model", "old-0.1"])
def test_unusable_inputs(tmp_path, layout):
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    if layout == "full-model":
        (folder / "shards" / "model").mkdir(parents=True)
    elif layout == "old-0.1":
        (folder / "adapter_shards" / "model").mkdir(parents=True)
    message = {"nothing": "holds no adapter", "full-model": "full-model checkpoint", "old-0.1": "0.1 adapter layout"}[
        layout
    ]
    with pytest.raises(CheckpointError, match=message):
        consolidate.consolidate_checkpoint(folder, tmp_path / "adapter")


@pytest.mark.parametrize(
    ("case", "replicated"),
    [
        ("tp4-all-modules", "layers.1.self_attn.q_proj.lora_A.weight"),  # plain replicated factor
        ("tp4-all-modules", "layers.0.self_attn.o_proj.lora_B.weight"),  # replicated B of a row-parallel layer
        ("tp4-all-modules", "layers.0.mlp.gate_up_proj.lora_A.weight"),  # shared A of the fused gate/up
        ("gqa-tp8-fused-qkv", "layers.1.self_attn.qkv_proj.lora_A.weight"),  # shared A of the fused q/k/v
    ],
)
def test_replicated_copies_that_differ_are_refused_naming_tensor_and_ranks(tmp_path, case, replicated):
    """Sequence parallelism on a LoRA run makes each TP rank train its own copy: no copy is the adapter."""
    shape, tp, targets, fuse_qkv = CASES[case]
    ranks, metadata = shard_adapter(shape, full_adapter(shape, targets), tp, fuse_qkv=fuse_qkv)
    name = next(key for key in ranks[0] if key.endswith(replicated))
    for rank in (2, 3):
        ranks[rank][name] = ranks[rank][name] + 1e-3 * rank  # drifted copies
    checkpoint = write_sharded_checkpoint(
        tmp_path / "checkpoint-5", ranks, metadata, adapter_config(targets), xser=True
    )
    with pytest.raises(CheckpointError) as refused:
        consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    message = str(refused.value)
    assert f"{name} is replicated over the {tp} TP ranks" in message
    assert "TP rank(s) 2, 3 differ from TP rank 0's by up to 0.003, more than one bf16 step" in message
    assert "sequence parallelism" in message and not (tmp_path / "adapter").exists()


def _one_bf16_step_up(tensor: torch.Tensor) -> torch.Tensor:
    """Each value moved to its next bf16 neighbour away from zero (its last mantissa bit + 1)."""
    bits = tensor.to(torch.bfloat16).view(torch.int16)
    return (bits + 1).view(torch.bfloat16).to(tensor.dtype)


@pytest.mark.parametrize(
    ("case", "replicated"),
    [
        ("tp4-all-modules", "layers.1.self_attn.q_proj.lora_A.weight"),
        ("gqa-tp8-fused-qkv", "layers.1.self_attn.qkv_proj.lora_A.weight"),
    ],
)
def test_replicated_copies_one_bf16_step_apart_keep_rank_0_and_log_the_difference(tmp_path, capsys, case, replicated):
    """Stochastic rounding or per-rank dropout can leave last-bit differences: not a reason to refuse."""
    shape, tp, targets, fuse_qkv = CASES[case]
    full = full_adapter(shape, targets)
    ranks, metadata = shard_adapter(shape, full, tp, fuse_qkv=fuse_qkv)
    name = next(key for key in ranks[0] if key.endswith(replicated))
    rounded = ranks[0][name].to(torch.bfloat16).to(ranks[0][name].dtype)
    for tensors in ranks:
        tensors[name] = rounded.clone()
    ranks[3][name] = _one_bf16_step_up(rounded)
    drift = float((ranks[3][name].float() - rounded.float()).abs().max())
    assert drift > 0
    checkpoint = write_sharded_checkpoint(
        tmp_path / "checkpoint-5", ranks, metadata, adapter_config(targets), xser=True
    )
    out = consolidate.consolidate_checkpoint(checkpoint, tmp_path / "adapter")
    assert f"note: {name}: the {tp} TP ranks' copies differ by up to {drift:.3g}" in capsys.readouterr().out
    rebuilt = load_file(out / "adapter_model.safetensors")
    kept = [key for key, tensor in rebuilt.items() if tensor.shape == rounded.shape and torch.equal(tensor, rounded)]
    assert kept, "TP rank 0's copy is the one kept"


def _model_config_dir(tmp_path, shape, **changes):
    folder = tmp_path / "base-model"
    folder.mkdir(exist_ok=True)
    config = {
        "hidden_size": shape.hidden,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "vocab_size": shape.vocab,
    }
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, None),
        (
            {"num_key_value_heads": 4},
            r"k_proj\.lora_B\.weight is \[16, 4\] after consolidation, but .* implies \[32, 4\]",
        ),
        (
            {"hidden_size": 128, "intermediate_size": 256},
            r"down_proj\.lora_A\.weight is \[4, 128\] .* implies \[4, 256\]",
        ),
        ({"num_hidden_layers": 1}, r"layers\.1\.mlp\.down_proj is beyond the 1 layers of"),
    ],
    ids=["fits", "other-kv-heads", "other-hidden-size", "fewer-layers"],
)
def test_rebuilt_shapes_are_checked_against_the_model_config(tmp_path, capsys, changes, message):
    shape = CASES["gqa-tp4-kv-replicated"][0]
    _, checkpoint = sharded(tmp_path, "gqa-tp4-kv-replicated")
    model = _model_config_dir(tmp_path, shape, **changes)
    config = run_config(tmp_path, tmp_path / "run", model_dir=model)
    status = consolidate.main(["--config", str(config), "--checkpoint", str(checkpoint)])
    if message is None:
        assert status == 0 and (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
        return
    assert status == 2 and not (tmp_path / "run" / "adapter").exists()
    assert re.search(message, capsys.readouterr().err)
