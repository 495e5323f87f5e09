"""merge: equals peft's merge_and_unload on a tiny Llama, logits match, output loads offline.

Bad inputs stop clearly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from merge_fixtures import ATTENTION, MLP, Shape, shard_adapter
from nxd_files import run_config, write_sharded_checkpoint
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from llm_pipeline import consolidate, merge, run_state
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks

EVERYTHING = [*ATTENTION, *MLP, "embed_tokens", "lm_head"]


def tiny_base(folder, dtype: str):
    """The tiny GQA Llama (4 heads, 2 KV heads) saved in several shards with an index, plus tokenizer."""
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_llama(len(tokenizer)).to(getattr(torch, dtype))
    model.save_pretrained(folder, max_shard_size="60KB")
    tokenizer.save_pretrained(folder)
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


def peft_adapter(base, folder, targets, *, rslora: bool, neuron_shared_a: bool = False):
    """A trained-looking peft adapter (random non-zero B). With neuron_shared_a, fused modules share lora_A."""
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, use_rslora=rslora, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    if neuron_shared_a:
        for layer in peft_model.base_model.model.model.layers:
            for group in ((layer.self_attn, ("k_proj", "v_proj"), "q_proj"), (layer.mlp, ("up_proj",), "gate_proj")):
                parent, followers, leader = group
                for name in followers:
                    getattr(parent, name).lora_A["default"].weight.data.copy_(
                        getattr(parent, leader).lora_A["default"].weight.data
                    )
    peft_model.save_pretrained(folder)
    return folder


def peft_reference(base, adapter, dtype):
    from peft import PeftModel

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), adapter)


def expected_weight(base_tensor, adapter_tensors, module, scale):
    """W + scale * B @ A (embeddings: (B @ A).T) in fp32, cast back: what the merge must produce."""
    prefix = f"base_model.model.{module}"
    if f"{prefix}.lora_embedding_A" in adapter_tensors:
        delta = (adapter_tensors[f"{prefix}.lora_embedding_B"] @ adapter_tensors[f"{prefix}.lora_embedding_A"]).T
    else:
        delta = adapter_tensors[f"{prefix}.lora_B.weight"] @ adapter_tensors[f"{prefix}.lora_A.weight"]
    return (base_tensor.float() + scale * delta.float()).to(base_tensor.dtype)


def state(folder):
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(shard)
    return tensors


@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_merge_equals_peft_merge_and_unload_in_bf16(tmp_path, rslora):
    base = tiny_base(tmp_path / "base", "bfloat16")
    adapter = peft_adapter(base, tmp_path / "adapter", EVERYTHING, rslora=rslora)
    config = run_config(tmp_path, tmp_path / "run", model_dir=base)
    assert merge.main(["--config", str(config), "--adapter", str(adapter)]) == 0
    merged = tmp_path / "run" / "merged"

    scale = 8 / (math.sqrt(4) if rslora else 4)
    ours, before, factors = state(merged), state(base), load_file(adapter / "adapter_model.safetensors")
    updated = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in factors if ".lora_" in k}
    assert len(updated) == 2 * 7 + 2
    for name, tensor in ours.items():
        module = name.removesuffix(".weight")
        want = expected_weight(before[name], factors, module, scale) if module in updated else before[name]
        assert tensor.dtype == torch.bfloat16, name  # within one bf16 step of the fp32 result (BLAS sum order)
        torch.testing.assert_close(tensor, want, rtol=2**-7, atol=1e-30, msg=name)

    reference = peft_reference(base, adapter, torch.bfloat16)
    merged_reference = reference.merge_and_unload().state_dict()
    for name, tensor in ours.items():  # peft rounds the delta to bf16 before adding: within bf16 rounding
        torch.testing.assert_close(
            tensor.float(), merged_reference[name].float(), rtol=2**-7, atol=2**-7 * float(tensor.abs().max())
        )

    assert (merged / "model.safetensors.index.json").read_text() == (base / "model.safetensors.index.json").read_text()
    # every config and tokenizer file the base has (transformers 5 writes no special_tokens_map.json), copied as is
    extras = {path.name for path in base.glob("*.json") if not path.name.startswith("model")}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= extras
    assert extras <= {path.name for path in merged.iterdir()}
    for name in extras:
        assert (merged / name).read_bytes() == (base / name).read_bytes(), name


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2", "tp4-gqa"])
def test_neuron_checkpoint_consolidates_merges_and_matches_peft_logits(tmp_path, tp, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = tiny_base(tmp_path / "base", "float32")
    targets = [*ATTENTION, *MLP]
    trained = peft_adapter(base, tmp_path / "trained", targets, rslora=False, neuron_shared_a=True)
    full = load_file(trained / "adapter_model.safetensors")
    shape = Shape(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2, vocab=len(tiny.build_tokenizer()))
    ranks, metadata = shard_adapter(shape, full, tp)
    config = json.loads((trained / "adapter_config.json").read_text())
    write_sharded_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint-4", ranks, metadata, config, xser=True)
    run_state.record_finished(tmp_path / "run" / "checkpoints", 4, {})  # the run finished at step 4
    run_toml = run_config(tmp_path, tmp_path / "run", model_dir=base)
    assert consolidate.main(["--config", str(run_toml)]) == 0
    assert merge.main(["--config", str(run_toml)]) == 0

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "merged")
    inputs = tokenizer(["Describe the llama herd in the mountain valley ?"], return_tensors="pt")
    peft_model = peft_reference(base, tmp_path / "run" / "adapter", torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "merged", dtype=torch.float32)
    with torch.no_grad():
        want, got = peft_model(**inputs).logits, merged(**inputs).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(want, AutoModelForCausalLM.from_pretrained(base)(**inputs).logits, atol=1e-3)
