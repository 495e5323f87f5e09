"""merge of a QLoRA adapter (merge.qlora_base): onto the dequantized 4-bit base, which reproduces the weights the
4-bit model computes with, or onto the bf16 base; the logit difference of each from the adapter on the 4-bit
base (what training saw), measured on the tiny model (the figures in docs/merge.md come from this test's output).

bitsandbytes' CPU backend quantizes here; the trn1 lane never merges QLoRA, hence main_stack."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from llm_pipeline import config, generate, merge
from llm_pipeline.training.parts import model_part
from llm_pipeline.training.torch.methods import quantization_config
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def qlora_config(tmp_path, base, **merge_keys):
    lines = [
        "[paths]",
        f'model_dir = "{base}"',
        f'output_dir = "{tmp_path / "run"}"',
        "[train]",
        'backend = "torch"',
        'method = "qlora"',
        "[merge]",
        *(f'{key} = "{value}"' for key, value in merge_keys.items()),
    ]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny GQA Llama in bf16 (the dtype training loads a qlora base in), in several shards."""
    folder = tmp_path_factory.mktemp("base")
    tokenizer = tiny.build_tokenizer()
    tiny.build_llama(len(tokenizer)).to(torch.bfloat16).save_pretrained(folder, max_shard_size="60KB")
    tokenizer.save_pretrained(folder)
    return folder


def trained_adapter(base, folder, targets):
    """A peft adapter with non-zero A and B (r=8, alpha=16 as tiny-cpu.toml), as training leaves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(folder)
    return folder


def on_4bit(base, adapter=None):
    cfg = config.from_dict({"train": {"method": "qlora"}})
    return generate.load(base, adapter, "bfloat16", quantization=quantization_config(model_part(cfg)))[0]


def weights(folder):
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(shard)
    return tensors


def test_an_unknown_qlora_base_is_refused_naming_the_key():
    with pytest.raises(config.ConfigError, match=r"merge.qlora_base: invalid value 'nf4' \(allowed: dequantized, bf16"):
        config.from_dict({"merge": {"qlora_base": "nf4"}})
    assert config.RunConfig().merge.qlora_base == "dequantized"


@pytest.mark.main_stack
def test_the_dequantized_base_is_what_the_4bit_model_computes_with(tmp_path, base):
    """Every Linear4bit weight of the model loaded with the run's BitsAndBytesConfig, dequantized by bitsandbytes,
    equals the merged weight bit for bit where the adapter does not reach, and plus scale * B @ A where it does;
    the rest (embeddings, norms, lm_head, which transformers keeps unquantized) is copied as it is."""
    import bitsandbytes as bnb

    adapter = trained_adapter(base, tmp_path / "adapter", ["q_proj", "v_proj"])
    assert merge.main(["--config", str(qlora_config(tmp_path, base)), "--adapter", str(adapter)]) == 0
    merged, before, factors = weights(tmp_path / "run" / "merged"), weights(base), weights(adapter)

    quantized = {
        f"{name}.weight": bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
        for name, module in on_4bit(base).named_modules()
        if isinstance(module, bnb.nn.Linear4bit)
    }
    assert len(quantized) == 2 * 7 and "lm_head.weight" not in quantized
    cfg = config.load(qlora_config(tmp_path, base))
    assert merge.qlora_rounding(cfg, base, "dequantized").names == set(quantized)
    assert merge.qlora_rounding(cfg, base, "bf16") is None
    for name, tensor in merged.items():
        module = name.removesuffix(".weight")
        if name not in quantized:
            assert torch.equal(tensor, before[name]), name
        elif module.endswith(("q_proj", "v_proj")):
            prefix = f"base_model.model.{module}"
            delta = factors[f"{prefix}.lora_B.weight"] @ factors[f"{prefix}.lora_A.weight"] * (16 / 8)
            want = (quantized[name].float() + delta).to(torch.bfloat16)
            torch.testing.assert_close(tensor, want, rtol=2**-7, atol=1e-30, msg=name)
        else:
            assert torch.equal(tensor, quantized[name]), name
        assert tensor.dtype == torch.bfloat16


@pytest.mark.main_stack
def test_logit_difference_of_each_merged_base_from_the_adapter_on_the_4bit_base(tmp_path, base):
    """(a) the adapter on the 4-bit base, as training and evaluate see it, against the merged model on (b1) the
    dequantized base and (b2) the bf16 base: max and mean |logit difference| over the tiny dolly prompts."""
    from transformers import AutoModelForCausalLM

    adapter = trained_adapter(base, tmp_path / "adapter", LINEAR)
    tokenizer = tiny.build_tokenizer()
    texts = [f"{r['instruction']} {r['context']} {r['response']}" for r in tiny.dolly_records(8)]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    mask = batch["attention_mask"].bool()

    def logits(model):
        with torch.no_grad():
            return model(**batch).logits.float()[mask]

    trained = logits(on_4bit(base, adapter))
    differences = {}
    for choice in ("dequantized", "bf16"):
        out = tmp_path / choice
        argv = ["--config", str(qlora_config(tmp_path, base)), "--adapter", str(adapter), "--output", str(out)]
        assert merge.main([*argv, "--qlora-base", choice]) == 0
        gap = (logits(AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)) - trained).abs()
        differences[choice] = (gap.max().item(), gap.mean().item())
    print(
        f"\nqlora merge on the tiny model ({mask.sum().item()} token positions, logits of the adapter on the 4-bit "
        f"base: mean |logit| {trained.abs().mean().item():.4f}, std {trained.std().item():.4f})"
    )
    for choice, (largest, mean) in differences.items():
        print(f"merged onto the {choice} base: max |logit difference| {largest:.4f}, mean {mean:.5f}")
    dequantized, bf16 = differences["dequantized"], differences["bf16"]
    assert dequantized[0] < bf16[0] and dequantized[1] < bf16[1] / 2
