"""The attention kernel the neuron engine asks for, checked against the kernel's own length rule.

optimum-neuron 0.4.5's Llama attention calls neuronx-distributed's ``nki_flash_attn_func`` when the
model's attn_implementation is "flash_attention_2" (models/training/llama/modeling_llama.py), and
eager attention otherwise. neuronx-distributed v2.26.0, src/neuronx_distributed/kernels/flash_attn.py,
``nki_flash_attn_func``: it reads the sequence length from q (the last axis when
``transpose_nki_inputs``, else the third) and raises NotImplementedError when that length is not a
multiple of 2048. ``nxd_226_flash_attention_length_rule`` states that rule in our own code (the
package needs torch_xla and cannot be installed here), and every test runs it on what the project
really hands optimum-neuron: the attn_implementation of ``model_arguments`` (the same call for the
precompile run and the real run) and the width of a batch from the real collator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from payload_configs import DEFAULT_TOML, tiny_config, write_config

from llm_pipeline import config, prepare
from llm_pipeline.errors import StepError
from llm_pipeline.training.neuron import backend as neuron_backend
from llm_pipeline.training.neuron import rules as neuron_rules
from tools import tiny_model

pytestmark = pytest.mark.trn1

LENGTHS = (512, 1024, 2048, 4096, 8192)
LLAMA_HEADS, LLAMA_HEAD_DIM = 32, 128


def nxd_226_flash_attention_length_rule(q_shape: tuple[int, ...], transpose_nki_inputs: bool) -> None:
    """neuronx-distributed 2.26's nki_flash_attn_func length check (see the module docstring)."""
    seqlen = q_shape[3] if transpose_nki_inputs else q_shape[2]
    if seqlen % 2048 != 0:
        raise NotImplementedError("Only support sequence as multiples of 2K")


def handed_to_optimum_neuron(cfg: config.RunConfig, tokenizer) -> tuple[str, int]:
    """(attn_implementation, sequence length of a real batch) for this run config."""
    attention = neuron_backend.model_arguments(cfg)["attn_implementation"]
    short = [{"input_ids": [5 + i % 40 for i in range(n)]} for n in (17, 300)]
    width = neuron_backend.data_collator(cfg, tokenizer)(short)["input_ids"].shape[1]
    return attention, width


def run_like_optimum_neuron(attention: str, width: int) -> None:
    """What LlamaAttention does with these values: the flash kernel checks the length, eager has no rule."""
    assert attention in (neuron_rules.FLASH_ATTENTION, neuron_rules.EAGER_ATTENTION)
    if attention == neuron_rules.FLASH_ATTENTION:
        for transpose in (True, False):  # the rule reads the length from either layout
            shape = (1, LLAMA_HEADS, LLAMA_HEAD_DIM, width) if transpose else (1, LLAMA_HEADS, width, LLAMA_HEAD_DIM)
            nxd_226_flash_attention_length_rule(shape, transpose)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model.build_tokenizer()


def test_the_rule_as_stated_upstream_refuses_1024():
    with pytest.raises(NotImplementedError, match="multiples of 2K"):
        nxd_226_flash_attention_length_rule((1, 32, 128, 1024), True)
    nxd_226_flash_attention_length_rule((1, 32, 4096, 128), False)


@pytest.mark.parametrize("length", LENGTHS)
def test_every_length_hands_optimum_neuron_a_kernel_that_runs(hpl_env, tokenizer, length):
    cfg = tiny_config(hpl_env, data={"max_length": length, "packing": False})
    neuron_rules.check_neuron_run(cfg, None)
    attention, width = handed_to_optimum_neuron(cfg, tokenizer)
    assert width == length
    run_like_optimum_neuron(attention, width)
    expected = neuron_rules.FLASH_ATTENTION if length % 2048 == 0 else neuron_rules.EAGER_ATTENTION
    assert attention == expected


def test_the_default_config_gets_eager_at_1024_and_the_full_configs_flash_at_4096(hpl_env, tokenizer):
    default = config.load(DEFAULT_TOML, env=hpl_env)
    assert default.data.max_length == 1024
    assert handed_to_optimum_neuron(default, tokenizer) == (neuron_rules.EAGER_ATTENTION, 1024)
    for name in ("llama2-7b-full.toml", "llama3-8b-full.toml"):
        full = config.load(DEFAULT_TOML.parent / name, env=hpl_env)
        neuron_rules.check_neuron_run(full, None)
        attention, width = handed_to_optimum_neuron(full, tokenizer)
        assert (attention, width) == (neuron_rules.FLASH_ATTENTION, 4096)
        run_like_optimum_neuron(attention, width)


@pytest.mark.parametrize("length", LENGTHS)
def test_an_explicit_flash_choice_that_cannot_run_is_refused(hpl_env, tokenizer, length):
    cfg = tiny_config(hpl_env, data={"max_length": length, "packing": False}, train={"attention": "flash_attention_2"})
    if length % 2048 == 0:
        neuron_rules.check_neuron_run(cfg, None)
        run_like_optimum_neuron(*handed_to_optimum_neuron(cfg, tokenizer))
        return
    with pytest.raises(StepError, match=r"train.attention = 'flash_attention_2' with data.max_length = \d+") as refused:
        neuron_rules.check_neuron_run(cfg, None)
    assert "set data.max_length = 2048" in str(refused.value)
    with pytest.raises(NotImplementedError):  # what would have happened after the model loaded
        run_like_optimum_neuron(*handed_to_optimum_neuron(cfg, tokenizer))


def test_explicit_eager_runs_at_any_length(hpl_env, tokenizer):
    cfg = tiny_config(hpl_env, data={"max_length": 4096, "packing": False}, train={"attention": "eager"})
    neuron_rules.check_neuron_run(cfg, None)
    assert handed_to_optimum_neuron(cfg, tokenizer) == ("eager", 4096)


def test_prepare_refuses_flash_at_1024_naming_both_keys(hpl_env, tmp_path, capsys):
    path = write_config(
        tmp_path / "run.toml",
        hpl_env,
        data={"max_length": 1024, "packing": False},
        train={"backend": "neuron", "attention": "flash_attention_2"},
    )
    assert prepare.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.attention" in err and "data.max_length = 1024" in err


def test_sdpa_is_refused_on_neuron(hpl_env):
    with pytest.raises(config.ConfigError, match=r"train.attention: 'sdpa' cannot run on the neuron backend"):
        tiny_config(hpl_env, train={"backend": "neuron", "attention": "sdpa"})


def test_precompile_and_train_load_the_model_through_the_one_decision():
    """run() loads the model with one from_pretrained call, fed by model_arguments(cfg), whatever the plan (its
    other from_pretrained reads the model's config for the trainable count)."""
    tree = ast.parse(Path(neuron_backend.__file__).read_text())
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run")
    loads = [
        node
        for node in ast.walk(run)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("from_pretrained")
        and not ast.unparse(node.func).startswith("AutoConfig.")
    ]
    assert len(loads) == 1 and "**model_arguments(cfg)" in ast.unparse(loads[0])
    model_arguments = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "model_arguments")
    assert "attention_kernel(cfg)" in ast.unparse(model_arguments)
