"""What the neuron path hands to optimum-neuron 0.4.5, run here: the collator, the token counter, the
run rules (packing, fused q/k/v) and the trainable count.

optimum-neuron's trainer module needs torch_xla to import, so its default collator is compiled from
the installed source on top of trl's real base class, to show what our collator replaces.
"""

from __future__ import annotations

import ast
import dataclasses
import types

import api_source
import pytest
import torch
from payload_configs import tiny_config

from llm_pipeline import model_shapes, prepare, train
from llm_pipeline.config import ConfigError
from llm_pipeline.errors import StepError
from llm_pipeline.training.callbacks import TokenCounter
from llm_pipeline.training.neuron import backend as neuron_backend
from llm_pipeline.training.neuron import rules as neuron_rules
from tools import tiny_model

pytestmark = pytest.mark.trn1

MAX_LENGTH = 64
LENGTHS = (27, 33, 41, 59)  # dolly-like records, all shorter than max_length
LLAMA3_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
}


@pytest.fixture(scope="module")
def llama3_like_tokenizer():
    """The tiny tokenizer without a pad token, like Llama 3's (padding then uses EOS)."""
    tokenizer = tiny_model.build_tokenizer()
    tokenizer.pad_token = None
    return tokenizer


def _examples(lengths=LENGTHS) -> list[dict[str, list[int]]]:
    return [{"input_ids": [5 + (i + n) % 40 for i in range(n)]} for n in lengths]


def upstream_default_collator(pad_token_id: int):
    """optimum-neuron 0.4.5's NeuronDataCollatorForLanguageModeling, compiled from its installed source."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    found = api_source.resolve("optimum.neuron.trainers.sft_trainer", "NeuronDataCollatorForLanguageModeling")
    namespace = {"DataCollatorForLanguageModeling": DataCollatorForLanguageModeling}
    exec(compile(ast.Module([found.node], []), "sft_trainer.py", "exec"), namespace)
    cls = namespace["NeuronDataCollatorForLanguageModeling"]
    return cls(max_length=MAX_LENGTH, pad_token_id=pad_token_id, completion_only_loss=False, padding_free=False)


def test_upstream_default_collator_trains_on_padding(llama3_like_tokenizer):
    """Why we pass our own: the default labels every padded position and attends to it (64/64 per row)."""
    batch = upstream_default_collator(llama3_like_tokenizer.eos_token_id)(_examples())
    assert (batch["labels"] != -100).sum(dim=1).tolist() == [MAX_LENGTH] * len(LENGTHS)
    assert batch["attention_mask"].sum(dim=1).tolist() == [MAX_LENGTH] * len(LENGTHS)


def test_neuron_collator_masks_padding_at_a_fixed_length(hpl_env, llama3_like_tokenizer):
    cfg = tiny_config(hpl_env, data={"max_length": MAX_LENGTH, "packing": False})
    collator = neuron_backend.data_collator(cfg, llama3_like_tokenizer)
    examples = _examples((*LENGTHS, 80))  # the last one is longer than max_length
    batch = collator(examples)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (5, MAX_LENGTH)
    for row, example in enumerate(examples):
        real = min(len(example["input_ids"]), MAX_LENGTH)
        ids = torch.tensor(example["input_ids"][:real])
        assert torch.equal(batch["input_ids"][row, :real], ids)
        assert torch.equal(batch["labels"][row, :real], ids)
        assert batch["attention_mask"][row].tolist() == [1] * real + [0] * (MAX_LENGTH - real)
        assert (batch["labels"][row, real:] == -100).all()
        assert (batch["input_ids"][row, real:] == llama3_like_tokenizer.eos_token_id).all()
    assert len(examples[-1]["input_ids"]) == 80  # the caller's examples are left alone
    # A batch of short rows is still max_length wide: one shape, one compiled graph.
    assert collator(_examples((3, 5)))["input_ids"].shape == (2, MAX_LENGTH)


@pytest.mark.parametrize("which", ["ours", "upstream default"])
def test_token_counter_counts_only_real_tokens(hpl_env, llama3_like_tokenizer, which):
    cfg = tiny_config(hpl_env, data={"max_length": MAX_LENGTH, "packing": False})
    eos = llama3_like_tokenizer.eos_token_id
    inner = (
        neuron_backend.data_collator(cfg, llama3_like_tokenizer) if which == "ours" else upstream_default_collator(eos)
    )
    counter = TokenCounter(inner)
    counter(_examples())
    counter(_examples((80, 10)))
    assert counter.real == sum(LENGTHS) + MAX_LENGTH + 10
    assert counter.total == 6 * MAX_LENGTH


def test_packing_is_refused_on_neuron_before_anything_loads(hpl_env):
    """At load (backend neuron) and at train start (auto resolved to neuron): refusals.REFUSALS' line."""
    with pytest.raises(ConfigError, match=r"data.packing: True cannot run on the neuron backend: packed batches"):
        tiny_config(hpl_env, data={"packing": True}, train={"backend": "neuron"})
    with pytest.raises(ConfigError, match=r"data.packing: True cannot run on the neuron backend"):
        train.train(tiny_config(hpl_env, data={"packing": True}), "neuron")


def _llama3(tmp_path, **changes):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(__import__("json").dumps({**LLAMA3_8B, **changes}))
    return folder


@pytest.mark.parametrize(("tp", "multiplier"), [(1, None), (4, None), (8, None), (16, 2), (32, 4)])
def test_kv_multiplier_follows_optimum_neuron(tp, multiplier):
    assert neuron_rules.kv_size_multiplier(8, tp) == multiplier


def test_tp_above_the_kv_heads_needs_q_k_v_together(hpl_env):
    cfg = tiny_config(hpl_env, data={"packing": False}, parallel={"tensor_parallel_size": 16, "devices_per_node": 32})
    cfg = cfg.__class__(**{**cfg.__dict__, "lora": cfg.lora.__class__(target_modules=("q_proj", "v_proj"))})
    with pytest.raises(StepError) as refused:
        neuron_rules.check_neuron_run(cfg, LLAMA3_8B, "Meta-Llama-3-8B/config.json")
    message = str(refused.value)
    for text in ("parallel.tensor_parallel_size = 16", "8 KV heads", "lora.target_modules", "q_proj, v_proj"):
        assert text in message
    for targets in (("q_proj", "k_proj", "v_proj"), ("o_proj",)):
        fine = cfg.__class__(**{**cfg.__dict__, "lora": cfg.lora.__class__(target_modules=targets)})
        neuron_rules.check_neuron_run(fine, LLAMA3_8B)


def test_prepare_refuses_a_neuron_run_it_can_tell_is_wrong(tmp_path, hpl_env, capsys):
    from payload_configs import write_config

    model = _llama3(tmp_path)
    config = write_config(
        tmp_path / "run.toml",
        hpl_env,
        train={"backend": "neuron"},
        data={"packing": False},
        paths={"model_dir": str(model)},
        parallel={"tensor_parallel_size": 32, "devices_per_node": 32},
        lora={"target_modules": ["q_proj", "v_proj"]},
    )
    assert prepare.main(["--config", str(config)]) == 2
    assert "lora.target_modules must name all three" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tp", "targets", "count"),
    [
        (8, ("q_proj", "v_proj"), 6_815_744),  # the blog's count: q/k/v stay separate
        (16, ("q_proj", "k_proj", "v_proj"), 6_291_456),  # fused qkv_proj, KV heads x2
        (32, ("q_proj", "k_proj", "v_proj"), 8_388_608),  # fused qkv_proj, KV heads x4
    ],
)
def test_trainable_count_on_llama3_8b_matches_optimum_neuron(tp, targets, count):
    from llm_pipeline.config import LoraConfig, RunConfig

    model_config = types.SimpleNamespace(**LLAMA3_8B)
    multiplier = neuron_rules.kv_size_multiplier(LLAMA3_8B["num_key_value_heads"], tp)
    lora = LoraConfig(r=16, alpha=16, target_modules=targets)
    expected = model_shapes.expected_lora_parameters(
        model_config, lora, fused_gate_up=True, kv_size_multiplier=multiplier
    )
    assert expected == count
    # what the neuron engine checks its trainer's count against
    default = RunConfig()
    cfg = dataclasses.replace(
        default, lora=lora, parallel=dataclasses.replace(default.parallel, tensor_parallel_size=tp)
    )
    assert neuron_backend.expected_trainable(cfg, model_config) == count
