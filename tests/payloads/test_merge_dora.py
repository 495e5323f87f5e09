"""The streaming merge of DoRA adapters equals peft's merge_and_unload, row block by row block."""

from __future__ import annotations

import pytest
import torch
from nxd_files import run_config
from safetensors.torch import load_file, save_file
from test_merge import state, tiny_base
from transformers import AutoModelForCausalLM

from llm_pipeline import merge
from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights import merge_stream

pytestmark = pytest.mark.both_stacks

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def dora_adapter(base, folder):
    """A trained-looking DoRA adapter: random B and magnitudes away from the base norms."""
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, use_dora=True, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(0)
    for name, parameter in peft_model.named_parameters():
        if "lora_magnitude_vector" in name:
            parameter.data *= 1 + 0.2 * torch.rand(parameter.shape, generator=generator)
    peft_model.save_pretrained(folder)
    return folder


def peft_merged(base, adapter, dtype):
    from peft import PeftModel

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), adapter)
    return model.merge_and_unload().state_dict()


@pytest.mark.parametrize(
    ("dtype", "rtol"),
    # fp32: the same arithmetic; bf16: peft rounds delta, norm and factor to bf16 along the way,
    # the stream rounds once at the end, so they agree within two bf16 steps.
    [("float32", 1e-5), ("bfloat16", 2**-6)],
)
def test_dora_merge_equals_peft_merge_and_unload(tmp_path, monkeypatch, dtype, rtol):
    monkeypatch.setattr(merge_stream, "BLOCK_BYTES", 1024)  # several row blocks per weight
    base = tiny_base(tmp_path / "base", dtype)
    adapter = dora_adapter(base, tmp_path / "adapter")
    config = run_config(tmp_path, tmp_path / "run", model_dir=base)
    assert merge.main(["--config", str(config), "--adapter", str(adapter)]) == 0

    ours, before = state(tmp_path / "run" / "merged"), state(base)
    reference = peft_merged(base, adapter, getattr(torch, dtype))
    changed = 0
    for name, tensor in ours.items():
        assert tensor.dtype == getattr(torch, dtype), name
        scale = float(reference[name].abs().max())
        torch.testing.assert_close(tensor.float(), reference[name].float(), rtol=rtol, atol=rtol * scale, msg=name)
        changed += not torch.equal(tensor, before[name])
    assert changed == 2 * 7 + 1  # every targeted weight, nothing else


def test_dora_row_norms_match_the_magnitudes(tmp_path):
    """By construction every merged row has the learned magnitude as its norm."""
    base = tiny_base(tmp_path / "base", "float32")
    adapter = dora_adapter(base, tmp_path / "adapter")
    config = run_config(tmp_path, tmp_path / "run", model_dir=base)
    assert merge.main(["--config", str(config), "--adapter", str(adapter)]) == 0
    merged, factors = state(tmp_path / "run" / "merged"), load_file(adapter / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector"
    rows = torch.linalg.norm(merged["model.layers.1.mlp.down_proj.weight"], dim=1)
    torch.testing.assert_close(rows, factors[key], rtol=1e-5, atol=0)


def test_magnitude_missing_or_unexpected_is_refused(tmp_path):
    base = tiny_base(tmp_path / "base", "float32")
    adapter = dora_adapter(base, tmp_path / "adapter")
    weights = adapter / "adapter_model.safetensors"
    tensors = load_file(weights)
    del tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"]
    save_file(tensors, weights)
    with pytest.raises(CheckpointError, match=r"q_proj has no lora_magnitude_vector"):
        merge.merge(base, adapter, tmp_path / "out")
    config_file = adapter / "adapter_config.json"
    config_file.write_text(config_file.read_text().replace('"use_dora": true', '"use_dora": false'))
    with pytest.raises(CheckpointError, match=r"has a DoRA magnitude but use_dora is false"):
        merge.merge(base, adapter, tmp_path / "out")
