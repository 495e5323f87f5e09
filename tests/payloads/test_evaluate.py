"""The evaluate step's score is the model's own next-token loss, token-weighted over rows of
different lengths with the padding left out; block-mode rows are scored as they are."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llm_pipeline import evaluate, generate

pytestmark = pytest.mark.both_stacks


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_models_dir):
    return generate.load(tiny_models_dir / "tiny-llama", None, "float32")


def test_score_is_the_model_loss_token_weighted_without_padding(model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    records = [
        {"instruction": "Describe a llama?", "context": "", "response": "A camelid."},
        {"instruction": "Why is the sky blue at noon and red at dusk?", "context": "Light.", "response": "Scattering."},
    ]
    rows = evaluate.token_rows(records, tokenizer, max_length=64)
    assert rows[0][-1] == tokenizer.eos_token_id and len(rows[0]) != len(rows[1])
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([r]), labels=torch.tensor([r])).loss.item() for r in rows]
    expected = sum(loss * (len(r) - 1) for loss, r in zip(alone, rows, strict=True)) / sum(len(r) - 1 for r in rows)
    result = evaluate.score(model, rows, batch_size=2)  # one padded batch
    assert result["validation_loss"] == pytest.approx(expected, rel=1e-5)
    assert result["tokens"] == sum(len(r) - 1 for r in rows) and result["rows"] == 2
    assert result["perplexity"] == pytest.approx(math.exp(expected))
    assert evaluate.score(model, rows, batch_size=1)["validation_loss"] == pytest.approx(expected, rel=1e-5)


def test_block_rows_are_scored_as_they_are_and_cut_at_max_length(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    blocks = [{"input_ids": list(range(5, 25))}, {"input_ids": list(range(30, 50))}]
    assert evaluate.token_rows(blocks, tokenizer, max_length=16) == [list(range(5, 21)), list(range(30, 46))]


@pytest.mark.main_stack
def test_chat_rows_are_scored_and_asked_through_the_chat_template(model_and_tokenizer, tmp_path):
    import json

    from tools import tiny_model

    _, tokenizer = model_and_tokenizer
    path = tiny_model.write_chat_jsonl(tmp_path / "chat.jsonl", 3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert evaluate.token_rows(rows, tokenizer, 64) == [
        tokenizer.apply_chat_template(row["messages"], return_dict=False)[:64] for row in rows
    ]
    asked, prompts = evaluate.chat_questions(rows, tokenizer)
    for row, (question, _, reference), prompt in zip(rows, asked, prompts, strict=True):
        *before, last = row["messages"]
        assert last["role"] == "assistant" and reference == last["content"] and question == before[-1]["content"]
        assert prompt == tokenizer.apply_chat_template(before, add_generation_prompt=True, tokenize=False)


def test_completion_only_validation_loss_is_the_masked_loss_over_the_answer_tokens(model_and_tokenizer, hpl_env):
    """The loss evaluate reports for a completion-only run is training's: cross entropy over the response
    tokens (and EOS) only, computed here by hand; the every-token loss is reported beside it."""
    import torch
    from payload_configs import tiny_config

    from llm_pipeline.prompt import format_prompt

    model, tokenizer = model_and_tokenizer
    cfg = tiny_config(hpl_env, data={"completion_only_loss": True, "max_length": 128})
    records = [
        {"instruction": "Describe a llama?", "context": "", "response": "A camelid of the Andes."},
        {"instruction": "Why is the sky blue?", "context": "Light scatters.", "response": "Rayleigh scattering."},
    ]
    total, tokens = 0.0, 0
    for record in records:
        prompt = tokenizer(format_prompt(record["instruction"], record["context"]))["input_ids"]
        answer = tokenizer(record["response"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        for position in range(len(prompt), len(prompt) + len(answer)):  # each answer token, from the one before
            total -= logprobs[position - 1, ids[0, position]].item()
            tokens += 1
    scores = evaluate.held_out_scores(cfg, model, tokenizer, records)
    assert scores["objective"] == evaluate.OBJECTIVE_ANSWERS and scores["tokens"] == tokens
    assert scores["validation_loss"] == pytest.approx(total / tokens, rel=1e-5)
    every = evaluate.score(model, evaluate.token_rows(records, tokenizer, 128), batch_size=2)
    assert scores["all_tokens"] == every and every["tokens"] > tokens

    every_token_cfg = tiny_config(hpl_env, data={"completion_only_loss": False})
    full = evaluate.held_out_scores(every_token_cfg, model, tokenizer, records)
    assert full["objective"] == evaluate.OBJECTIVE_ALL and "all_tokens" not in full
    assert full["validation_loss"] == pytest.approx(every["validation_loss"])


@pytest.mark.main_stack
def test_a_qlora_adapter_is_evaluated_on_the_4bit_base_it_was_trained_against(hpl_env):
    """bitsandbytes' CPU backend: the tuned model of a qlora run is the adapter on the NF4 base (the run's
    BitsAndBytesConfig), even with a merged (bf16-base) model in the run folder; its loss is not the bf16 one."""
    import bitsandbytes as bnb
    import torch
    from payload_configs import tiny_config
    from peft import LoraConfig, get_peft_model

    cfg = tiny_config(hpl_env, train={"method": "qlora"})
    model, tokenizer = generate.load(Path(cfg.paths.model_dir), None, "float32")
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(cfg.paths.adapter_dir)
    (cfg.paths.merged_dir).mkdir(parents=True)
    (cfg.paths.merged_dir / "config.json").write_text("{}")  # generate would pick this one

    model_dir, adapter_dir, quantization = evaluate.tuned_model(cfg)
    assert (model_dir, adapter_dir) == (Path(cfg.paths.model_dir), cfg.paths.adapter_dir)
    assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
    records = [{"instruction": "Describe a llama?", "context": "", "response": "A camelid of the Andes."}]
    rows = evaluate.token_rows(records, tokenizer, 128)
    on_4bit, _ = generate.load(model_dir, adapter_dir, "float32", quantization=quantization)
    assert isinstance(on_4bit.base_model.model.model.layers[0].self_attn.q_proj.base_layer, bnb.nn.Linear4bit)
    on_bf16, _ = generate.load(model_dir, adapter_dir, "bfloat16")
    quantized, plain = (evaluate.score(m, rows, batch_size=1)["validation_loss"] for m in (on_4bit, on_bf16))
    result = evaluate.evaluate_model(cfg, "tuned", model_dir, adapter_dir, [], [], quantization)
    assert "4-bit nf4" in result["model"]
    assert quantized != pytest.approx(plain, rel=1e-4)
