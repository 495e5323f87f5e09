"""The expected LoRA parameter count: the blog's number, and peft's real count on the tiny model."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from llm_pipeline.config import LoraConfig
from llm_pipeline.errors import StepError
from llm_pipeline.model_shapes import expected_lora_parameters
from llm_pipeline.training.plan import check_target_modules, check_trainable, peft_lora_config
from tools import tiny_model as tiny

LLAMA_3_8B = LlamaConfig(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_llama_3_8b_default_lora_is_the_blog_count():
    assert expected_lora_parameters(LLAMA_3_8B, LoraConfig()) == 6_815_744


@pytest.mark.parametrize(
    ("r", "targets"),
    [
        (16, ("q_proj", "v_proj")),
        (8, ALL_LINEAR),
        (4, ("k_proj", "o_proj", "down_proj")),
        (2, ("embed_tokens", "lm_head")),
        (8, (*ALL_LINEAR, "embed_tokens", "lm_head")),
    ],
)
def test_formula_matches_peft_on_the_tiny_model(r, targets):
    from peft import get_peft_model

    model = tiny.build_llama(len(tiny.build_tokenizer()), hidden=32, layers=2, heads=4, kv_heads=2)
    lora = LoraConfig(r=r, target_modules=targets)
    peft_model = get_peft_model(model, peft_lora_config(lora))
    real = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert real == expected_lora_parameters(model.config, lora)


def test_fused_gate_up_shares_one_lora_a():
    lora = LoraConfig(r=16, target_modules=ALL_LINEAR)
    saved = 32 * 16 * 4096  # one [r, hidden] A matrix per layer
    assert (
        expected_lora_parameters(LLAMA_3_8B, lora, fused_gate_up=True)
        == expected_lora_parameters(LLAMA_3_8B, lora) - saved
    )
    assert expected_lora_parameters(LLAMA_3_8B, LoraConfig(), fused_gate_up=True) == 6_815_744


def test_a_different_trainable_count_stops_training():
    check_trainable(6_815_744, 6_815_744, LoraConfig())
    with pytest.raises(StepError, match=r"7,570,591,744 trainable parameters.*6,815,744.*#821"):
        check_trainable(7_570_591_744, 6_815_744, LoraConfig())


def test_target_module_missing_from_the_model_is_named():
    model = tiny.build_llama(len(tiny.build_tokenizer()), hidden=32, layers=1, heads=4, kv_heads=2)
    check_target_modules(model, LoraConfig(target_modules=ALL_LINEAR))
    with pytest.raises(StepError, match=r"lora\.target_modules: c_attn not found"):
        check_target_modules(model, LoraConfig(target_modules=("q_proj", "c_attn")))
