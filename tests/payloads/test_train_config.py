"""The GPU engine's run-config keys: values are checked, errors name the key, and a setting the
chosen backend cannot run is refused at load and at prepare."""

from __future__ import annotations

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import config, prepare, train


@pytest.mark.parametrize(
    ("section", "key", "value", "allowed"),
    [
        ("train", "method", "prefix", "lora, dora, qlora, full"),
        ("parallel", "strategy", "zero3", "fsdp, ddp"),
        ("train", "attention", "flash", "auto, sdpa, flash_attention_2, eager"),
        ("train", "profile", "ten", "FIRST-LAST"),
        ("train", "profile", "5-3", "1 <= FIRST <= LAST"),
        ("train", "profile", "0-2", "1 <= FIRST <= LAST"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(hpl_env, section, key, value, allowed):
    with pytest.raises(config.ConfigError, match=f"{section}.{key}: invalid value {value!r}.*{allowed}"):
        tiny_config(hpl_env, **{section: {key: value}})


def test_wrong_types_name_the_key(hpl_env):
    with pytest.raises(config.ConfigError, match=r"train\.compile: expected true or false"):
        tiny_config(hpl_env, train={"compile": "yes"})


def test_profile_window_parses_one_step_or_a_range(hpl_env):
    assert tiny_config(hpl_env).train.profile_window is None
    assert tiny_config(hpl_env, train={"profile": "7"}).train.profile_window == (7, 7)
    assert tiny_config(hpl_env, train={"profile": "20-22"}).train.profile_window == (20, 22)


def test_every_new_key_carries_a_description():
    import dataclasses

    described = {
        f"{part.name}.{f.name}"
        for part in dataclasses.fields(config.RunConfig)
        for f in dataclasses.fields(part.default_factory())
        if f.metadata.get("description")
    }
    wanted = {"train.method", "train.compile", "train.liger_kernel", "train.attention", "train.profile"}
    assert wanted | {"parallel.strategy"} <= described


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"method": "dora"}, "train.method: 'dora' cannot run on the neuron backend"),
        ({"method": "qlora"}, "train.method: 'qlora' cannot run on the neuron backend"),
        ({"compile": True}, "train.compile: True cannot run on the neuron backend"),
        ({"liger_kernel": True}, "train.liger_kernel: True cannot run on the neuron backend"),
        ({"attention": "sdpa"}, "train.attention: 'sdpa' cannot run on the neuron backend"),
    ],
)
def test_neuron_backend_refuses_what_it_cannot_run(hpl_env, changes, message):
    with pytest.raises(config.ConfigError, match=message):
        tiny_config(hpl_env, train={"backend": "neuron", **changes})
    # with backend auto the load passes; the check runs against the backend the runtime picks
    cfg = tiny_config(hpl_env, train={"backend": "auto", **changes})
    with pytest.raises(config.ConfigError, match=message):
        config.check_backend(cfg, "neuron")
    config.check_backend(cfg, "torch")


def test_prepare_refuses_a_method_the_backend_cannot_run(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"backend": "neuron", "method": "qlora"})
    assert prepare.main(["--config", str(path)]) == 2
    assert "train.method: 'qlora' cannot run on the neuron backend" in capsys.readouterr().err


def test_prepare_reports_backend_method_and_strategy(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"method": "dora"}, parallel={"strategy": "ddp"})
    assert prepare.main(["--config", str(path)]) == 0
    assert "backend torch: method dora, strategy ddp" in capsys.readouterr().out


def test_train_override_to_neuron_is_refused_before_any_work(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"method": "dora"})
    assert train.main(["--config", str(path), "--backend", "neuron"]) == 2
    assert "train.method: 'dora' cannot run on the neuron backend" in capsys.readouterr().err
