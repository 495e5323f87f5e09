"""train.method = full on the neuron backend: the arguments we hand optimum-neuron 0.4.5 (read from its
source, as the LoRA contract is), the trainable count it will report, the global batch check, the
storage check, and the shipped Llama 2 7B / Llama 3 8B run configs."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import api_source
import pytest
from full_fixtures import shard_full_model
from payload_configs import tiny_config, write_config
from transformers import AutoConfig

from llm_pipeline import config, prepare
from llm_pipeline.errors import StepError
from llm_pipeline.training import full_rules
from llm_pipeline.training.neuron import backend as train_neuron
from llm_pipeline.training.neuron import rules as neuron_rules
from tools import tiny_model as tiny

pytestmark = pytest.mark.trn1

CONFIGS = Path(config.__file__).resolve().parents[1] / "configs"
LLAMA3_8B = {
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
}  # fmt: skip


def method(source: str, cls: str, name: str) -> str:
    node = api_source.resolve(source, cls).node
    return ast.unparse(next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name))


def test_full_runs_with_sequence_parallelism_zero1_and_checkpointing(hpl_env):
    args = train_neuron.neuron_arguments(tiny_config(hpl_env, train={"method": "full", "gradient_checkpointing": True}))
    assert args["disable_sequence_parallel"] is False and args["zero_1"] is True
    assert args["gradient_checkpointing"] is True
    lora = train_neuron.neuron_arguments(tiny_config(hpl_env))
    assert lora["disable_sequence_parallel"] is True and lora["gradient_checkpointing"] is False
    # What optimum-neuron does with them: SP from the flag, ZeRO-1 and checkpointing into the trn_config.
    post_init = method("optimum.neuron.trainers.training_args", "NeuronTrainingArguments", "__post_init__")
    for wiring in (
        "sequence_parallel_enabled=not self.disable_sequence_parallel",
        "pipeline_parallel_use_zero1_optimizer=self.zero_1",
        "gradient_checkpointing=self.gradient_checkpointing",
    ):
        assert wiring in post_init
    fields = api_source.dataclass_fields(
        api_source.resolve("optimum.neuron.trainers.training_args", "NeuronTrainingArguments")
    )
    assert {"zero_1", "disable_sequence_parallel"} <= fields
    # With SP on, the only parameters that are not tensor-parallel are the norms, tagged for the TP all-reduce.
    norm = ast.unparse(api_source.resolve("optimum.neuron.models.training.llama.modeling_llama", "LlamaRMSNorm").node)
    assert "setattr(self.weight, 'sequence_parallel_enabled', sequence_parallel_enabled)" in norm


def test_the_full_count_is_what_optimum_neuron_counts(tmp_path):
    """get_model_param_count: a TP parameter counts local size x TP (replicated KV heads too), others once."""
    counting = ast.unparse(
        api_source.resolve("optimum.neuron.models.training.training_utils", "_get_model_param_count").node
    )
    assert (
        "if getattr(parameter, 'tensor_model_parallel', False):" in counting and "num_elements *= tp_size" in counting
    )
    model_dir = tiny.write_tiny_model(tmp_path / "m", heads=8, kv_heads=2)
    model_config = json.loads((model_dir / "config.json").read_text())
    state = tiny.build_llama(104, heads=8, kv_heads=2).state_dict()
    assert full_rules.parameter_count(model_config) == sum(t.numel() for t in state.values())
    for tp in (2, 4, 8):
        ranks, metadata = shard_full_model(state, model_config, tp)
        counted = sum(
            piece.numel() * (tp if metadata["parameters"][name]["tensor_model_parallel"] else 1)
            for name, piece in ranks[0].items()
        )
        multiplier = neuron_rules.kv_size_multiplier(model_config["num_key_value_heads"], tp)
        assert full_rules.parameter_count(model_config, multiplier) == counted, tp
        # what the neuron engine checks its trainer's count against
        cfg = dataclasses.replace(
            config.RunConfig(),
            train=dataclasses.replace(config.RunConfig().train, method="full"),
            parallel=dataclasses.replace(config.RunConfig().parallel, tensor_parallel_size=tp),
        )
        assert train_neuron.expected_trainable(cfg, AutoConfig.from_pretrained(model_dir)) == counted, tp
    assert full_rules.parameter_count(LLAMA3_8B) == 8_030_261_248


def test_a_partly_frozen_model_is_refused():
    train_neuron.check_full_trainable(8_030_261_248, 8_030_261_248)
    with pytest.raises(StepError, match="should train all 8,030,261,248"):
        train_neuron.check_full_trainable(6_815_744, 8_030_261_248)


def test_the_stated_global_batch_is_checked_against_the_layout(hpl_env):
    layout = {"tensor_parallel_size": 8, "devices_per_node": 32, "nodes": 2}
    batch = {"backend": "auto", "per_device_batch_size": 1, "global_batch_size": 256}
    unpacked = {"packing": False}  # the neuron backend refuses packing
    cfg = tiny_config(hpl_env, parallel=layout, train={**batch, "gradient_accumulation_steps": 32}, data=unpacked)
    config.check_backend(cfg, "neuron")  # 1 x DP 8 (64 cores / TP 8) x 32
    with pytest.raises(config.ConfigError, match=r"set train\.gradient_accumulation_steps = 32"):
        neuron = {**batch, "backend": "neuron", "gradient_accumulation_steps": 3}
        tiny_config(hpl_env, parallel=layout, train=neuron, data=unpacked)
    with pytest.raises(config.ConfigError, match=r"x 64 data-parallel replica\(s\) \(torch backend\)"):
        config.check_backend(cfg, "torch")  # the torch engines keep a replica per process


def test_storage_for_checkpoints_is_checked_and_says_what_to_change(hpl_env, tmp_path):
    cfg = tiny_config(hpl_env, train={"method": "full", "save_total_limit": 3})
    # torch saves the optimizer state for its resume (~112 GB); neuron saves the model only (~16 GB)
    assert full_rules.checkpoint_bytes(LLAMA3_8B, bf16=True, with_optimizer=True) == 8_030_261_248 * 14
    assert full_rules.checkpoint_bytes(LLAMA3_8B, bf16=True, with_optimizer=False) == 8_030_261_248 * 2
    huge = {**LLAMA3_8B, "num_hidden_layers": 32_000}  # ~16 TB per checkpoint: fits nowhere here
    for backend, what in (("torch", "weights \\+ optimizer state"), ("neuron", "weights")):
        with pytest.raises(
            StepError, match=rf"train\.save_total_limit: 3 checkpoint\(s\) of ~\d+ GB \({what}\)"
        ) as error:
            full_rules.check_storage(cfg, huge, backend=backend)
    assert "fsx_storage_capacity_gib" in str(error.value) and "Free space on it" in str(error.value)
    model_dir = tiny.write_tiny_model(tmp_path / "tiny")
    tiny_cfg = tiny_config(hpl_env, train={"method": "full"})
    tiny_model_config = json.loads((model_dir / "config.json").read_text())
    assert "GB free" in full_rules.check_storage(tiny_cfg, tiny_model_config, backend="neuron")


def test_prepare_reports_the_storage_plan_for_full_fine_tuning(hpl_env, tmp_path, tiny_models_dir, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"method": "full"})
    assert prepare.main(["--config", str(path)]) == 0
    assert "storage: 2 checkpoint(s) of ~0 GB (weights + optimizer state)" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "heads"), [("llama2-7b-full.toml", 32), ("llama3-8b-full.toml", 8)])
def test_the_shipped_full_configs_are_the_published_layout(name, heads):
    cfg = config.load(CONFIGS / name, env={})
    assert cfg.train.method == "full" and cfg.train.backend == "neuron" and cfg.data.max_length == 4096
    assert cfg.train.global_batch_size == 256 == config.data_parallel_size(cfg, "neuron") * 64
    assert cfg.train.gradient_checkpointing and not cfg.data.packing
    assert neuron_rules.kv_size_multiplier(heads, cfg.parallel.tensor_parallel_size) is None  # q/k/v stay separate
    args = train_neuron.neuron_arguments(cfg)
    assert args["tensor_parallel_size"] == 8 and args["disable_sequence_parallel"] is False
    neuron_rules.check_neuron_run(cfg, None)
