"""The shipped run configs: default.toml is the blog run and equals the dataclass defaults."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib
from payload_configs import CONFIGS, DEFAULT_TOML, TINY_TOML, tiny_config

from llm_pipeline import config
from tests.slurm.slurm_helpers import prepare_said
from tools.rehearse import GPU_EXAMPLES, TINY_SHAPE, tiny_shape_config


def test_default_toml_equals_the_dataclass_defaults():
    env = {"HPL_OUTPUTS_DIR": "/out", "HPL_MODELS_DIR": "/models"}
    assert config.load(DEFAULT_TOML, env=env) == config.from_dict({}, env=env)


def test_default_toml_lists_every_key():
    raw = tomllib.loads(DEFAULT_TOML.read_text())
    for section in dataclasses.fields(config.RunConfig):
        names = {f.name for f in dataclasses.fields(section.default_factory())}
        assert set(raw[section.name]) == names, section.name


def test_default_toml_is_the_blog_run():
    cfg = config.load(DEFAULT_TOML, env={})
    assert cfg.model.id == "meta-llama/Meta-Llama-3-8B" and cfg.model.dtype == "bfloat16"
    assert (
        cfg.parallel.tensor_parallel_size,
        cfg.train.per_device_batch_size,
        cfg.train.gradient_accumulation_steps,
    ) == (8, 1, 3)
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (
        16,
        16,
        0.05,
        ("q_proj", "v_proj"),
    )
    assert (cfg.data.max_length, cfg.train.bf16, cfg.train.seed) == (1024, True, 42)
    assert cfg.paths.output_dir == "/fsx/outputs/llama3-8b-dolly-lora"


def test_tiny_config_reads_its_paths_from_hpl_variables(hpl_env):
    cfg = tiny_config(hpl_env)
    assert cfg.paths.model_dir == f"{hpl_env['HPL_MODELS_DIR']}/tiny-llama"
    assert cfg.data.dataset == f"{hpl_env['HPL_DATASETS_DIR']}/tiny-dolly.jsonl"
    assert cfg.paths.checkpoints_dir.parent == cfg.paths.data_dir.parent
    assert cfg.train.backend == "torch" and not cfg.train.bf16


def test_tiny_config_without_hpl_variables_names_the_variable():
    with pytest.raises(config.ConfigError, match="HPL_"):
        config.load(TINY_TOML, env={})


def test_unknown_target_module_is_a_config_error(hpl_env):
    with pytest.raises(config.ConfigError, match=r"lora\.target_modules.*c_attn"):
        tiny_config(hpl_env, lora={"target_modules": ["q_proj", "c_attn"]})


@pytest.mark.parametrize("name", sorted(GPU_EXAMPLES))
def test_gpu_example_is_accepted_by_prepare_on_its_instance(name, monkeypatch, capsys):
    from stacks.accelerators import INSTANCE_TYPES

    instance_type, method = GPU_EXAMPLES[name]
    path = CONFIGS / name
    assert instance_type in path.read_text().split("\n\n", 1)[0], "the header names the instance it is sized for"
    facts = INSTANCE_TYPES[instance_type]
    cfg = config.load(path, env={})
    assert (cfg.train.backend, cfg.train.method, cfg.parallel.devices_per_node) == ("torch", method, facts.devices)
    assert facts.accelerator == "cuda" and cfg.model.id.startswith("meta-llama/Llama-3.")
    prepare_on_node(path, cfg.model.id, facts.devices, monkeypatch, capsys)


def flat_keys(path) -> dict[tuple[str, str], object]:
    """{(table, key): value} of a run config file as TOML reads it."""
    tables = tomllib.loads(path.read_text())
    return {(table, key): value for table, keys in tables.items() for key, value in keys.items()}


@pytest.mark.parametrize("name", sorted(GPU_EXAMPLES))
def test_gpu_example_at_tiny_shape_keeps_its_own_keys_and_replaces_the_table(name, tmp_path):
    example = CONFIGS / name
    path = tiny_shape_config(example, tmp_path / "fsx", tmp_path)
    own, derived = flat_keys(example), flat_keys(path)
    run_folder = ("paths", "output_dir")
    assert derived == {**own, **TINY_SHAPE, run_folder: str(tmp_path / "fsx" / "outputs" / f"{example.stem}-tiny")}
    kept = set(own) - set(TINY_SHAPE) - {run_folder}
    assert {("train", "method"), ("parallel", "strategy"), ("data", "packing"), ("lora", "r")} <= kept
    replaced = ", ".join(f"{table}.{key}" for table, key in TINY_SHAPE)
    assert path.read_text().splitlines()[0] == f"# {name} for a CPU rehearsal (tools/rehearse.py replaced {replaced})"


@pytest.mark.parametrize("name", sorted(GPU_EXAMPLES))
def test_gpu_example_at_tiny_shape_is_accepted_by_prepare_on_one_cpu(name, tmp_path, monkeypatch, capsys):
    from llm_pipeline.training import device
    from llm_pipeline.training.torch.backend import check_lever_packages

    for variable in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))
    path = tiny_shape_config(CONFIGS / name, tmp_path / "fsx", tmp_path)
    cfg = config.load(path)
    assert (cfg.train.method, cfg.parallel.devices_per_node) == (GPU_EXAMPLES[name][1], 1)
    check_lever_packages(cfg, kind=device.CPU)  # the train step's lever check on this CPU host
    said = prepare_on_node(path, "tiny-random-llama", 1, monkeypatch, capsys)
    # with the example's own method, strategy, scheduler and optimizer (its chain under Slurm starts at data)
    assert prepare_said(config.load(CONFIGS / name, env={})) <= set(said.splitlines())


TRN2_EXAMPLES = {"llama3-8b-lora-trn2.toml": "lora", "llama3-8b-full-trn2.toml": "full"}


@pytest.mark.parametrize("name", sorted(TRN2_EXAMPLES))
def test_trn2_example_is_accepted_by_prepare_on_its_node(name, monkeypatch, capsys):
    from stacks.accelerators import INSTANCE_TYPES, TORCHNEURON

    path = CONFIGS / name
    assert "ml.trn2.48xlarge" in path.read_text().split("\n\n", 1)[0], "the header names the instance it is sized for"
    facts = INSTANCE_TYPES["ml.trn2.48xlarge"]
    cfg = config.load(path, env={})
    assert facts.image_family == TORCHNEURON
    assert (cfg.train.backend, cfg.train.method, cfg.parallel.strategy) == ("torch", TRN2_EXAMPLES[name], "fsdp")
    assert cfg.parallel.devices_per_node == facts.devices and not cfg.data.packing  # one shape on neuron
    prepare_on_node(path, cfg.model.id, facts.devices, monkeypatch, capsys)


def prepare_on_node(path, model_id: str, devices: int, monkeypatch, capsys) -> str:
    """prepare accepts the config on a node with ``devices`` devices and asks the Hub for its model (the
    Hub itself is out of reach here: what prepare asks it is recorded); what it printed."""
    from llm_pipeline import prepare

    monkeypatch.setenv("HPL_DEVICES_PER_NODE", str(devices))
    asked = []
    monkeypatch.setattr(prepare, "hub_check", lambda key, repo_id, **_: asked.append((key, repo_id)))
    assert prepare.main(["--config", str(path)]) == 0, capsys.readouterr().err
    assert ("model.id", model_id) in asked
    out = capsys.readouterr().out
    assert f"processes per node: {devices}" in out
    return out


def test_the_dpo_example_starts_from_the_sft_examples_merged_model():
    from stacks.accelerators import INSTANCE_TYPES

    dpo, sft = (config.load(CONFIGS / name, env={}) for name in ("llama3-8b-dpo-g6e.toml", "llama3-8b-lora-g6e.toml"))
    assert "ml.g6e.xlarge" in (CONFIGS / "llama3-8b-dpo-g6e.toml").read_text().split("\n\n", 1)[0]
    assert (dpo.train.objective, dpo.train.method, dpo.train.backend) == ("dpo", "lora", "torch")
    assert dpo.parallel.devices_per_node == INSTANCE_TYPES["ml.g6e.xlarge"].devices
    assert dpo.paths.model_dir == f"{sft.paths.output_dir}/merged" and dpo.model.id == sft.model.id
    assert dpo.train.init_from == sft.paths.output_dir  # named, not a hard-coded path
    assert "model_dir" not in (CONFIGS / "llama3-8b-dpo-g6e.toml").read_text()
