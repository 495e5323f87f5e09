"""prepare: processes per node have one source (parallel.devices_per_node); a node that disagrees stops the run."""

from __future__ import annotations

from payload_configs import write_config

from llm_pipeline import prepare


def test_a_node_with_other_device_count_fails_naming_both(hpl_env, tmp_path, monkeypatch, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, parallel={"devices_per_node": 1})
    monkeypatch.setenv("HPL_DEVICES_PER_NODE", "32")
    assert prepare.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: parallel.devices_per_node is 1 but this node has HPL_DEVICES_PER_NODE=32")
    assert "set parallel.devices_per_node = 32" in err


def test_matching_or_unknown_node_device_count_passes(hpl_env, tmp_path, monkeypatch, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, parallel={"devices_per_node": 1})
    monkeypatch.setenv("HPL_DEVICES_PER_NODE", "1")
    assert prepare.main(["--config", str(path)]) == 0
    assert "processes per node: 1 (parallel.devices_per_node, equals HPL_DEVICES_PER_NODE)" in capsys.readouterr().out
    monkeypatch.delenv("HPL_DEVICES_PER_NODE")
    assert prepare.main(["--config", str(path)]) == 0
    assert "HPL_DEVICES_PER_NODE is not set here" in capsys.readouterr().out


def test_a_neuron_run_is_told_once_that_the_trn1_lane_is_frozen(hpl_env, tmp_path, capsys):
    neuron = write_config(tmp_path / "neuron.toml", hpl_env, train={"backend": "neuron"}, data={"packing": False})
    assert prepare.main(["--config", str(neuron)]) == 0
    out = capsys.readouterr().out
    assert out.count("frozen at Neuron SDK 2.26.1") == 1
    assert "defect fixes only (docs/versions.md)" in out and "trn2 lane (docs/trainium2.md)" in out
    torch_run = write_config(tmp_path / "torch.toml", hpl_env, train={"backend": "torch"})
    assert prepare.main(["--config", str(torch_run)]) == 0
    assert "frozen" not in capsys.readouterr().out


def _prepare(tmp_path, env, **sections) -> int:
    return prepare.main(["--config", str(write_config(tmp_path / "run.toml", env, **sections))])


def _offline(monkeypatch) -> None:
    """HF_HUB_OFFLINE=1 as a step starts with it (the libraries read it at import, so their flags too)."""
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_unknown_lr_scheduler_or_optimizer_stops_at_prepare(hpl_env, tmp_path, capsys, monkeypatch):
    assert _prepare(tmp_path, hpl_env, train={"lr_scheduler": "cosin"}) == 2
    assert "train.lr_scheduler: invalid value 'cosin' (allowed: linear, cosine" in _one_error_line(capsys)
    from transformers import training_args

    # an optimizer this pipeline knows but the installed transformers lacks (an older image)
    names = [name for name in training_args.OptimizerNames if name.value != "paged_adamw_8bit"]
    monkeypatch.setattr(training_args, "OptimizerNames", names)
    assert _prepare(tmp_path, hpl_env, train={"optimizer": "paged_adamw_8bit"}) == 2
    assert "train.optimizer: 'paged_adamw_8bit' is not an optimizer of the installed" in _one_error_line(capsys)


def test_an_unreachable_model_or_dataset_id_stops_at_prepare_with_one_line(hpl_env, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    # A Hub that refuses connections (the discard port on this host): never the real network.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    missing = {"HPL_MODELS_DIR": str(tmp_path / "no-models")}
    assert _prepare(tmp_path, {**hpl_env, **missing}, model={"id": "no-such-owner/no-such-model"}) == 2
    assert "model.id no-such-owner/no-such-model: cannot reach the Hugging Face Hub" in _one_error_line(capsys)
    assert _prepare(tmp_path, hpl_env, data={"dataset": "no-such-owner/no-such-dataset"}) == 2
    assert "data.dataset no-such-owner/no-such-dataset: cannot reach the Hugging Face Hub" in _one_error_line(capsys)


def test_offline_mode_skips_the_hub_checks_with_a_note(hpl_env, tmp_path, capsys, monkeypatch):
    """A node without Hub access (HF_HUB_OFFLINE=1, the rehearsal's setting) is told what was not checked."""
    _offline(monkeypatch)
    missing = {"HPL_MODELS_DIR": str(tmp_path / "no-models")}
    assert _prepare(tmp_path, {**hpl_env, **missing}, model={"id": "no-such-owner/no-such-model"}) == 0
    assert "note: HF_HUB_OFFLINE is set: model.id no-such-owner/no-such-model not checked" in capsys.readouterr().out


def test_the_data_step_reports_an_unreachable_dataset_id_in_one_line(hpl_env, tmp_path, capsys, monkeypatch):
    from llm_pipeline import data

    _offline(monkeypatch)
    path = write_config(tmp_path / "run.toml", hpl_env, data={"dataset": "no-such-owner/no-such-dataset"})
    assert data.main(["--config", str(path)]) == 2
    assert "data.dataset no-such-owner/no-such-dataset: cannot reach it on the Hugging Face Hub" in _one_error_line(
        capsys
    )


def test_lora_target_modules_missing_from_the_model_stop_at_prepare(hpl_env, tmp_path, capsys):
    from transformers import GPT2Config

    other = tmp_path / "models" / "tiny-llama"  # a model of another architecture (fused c_attn, no q_proj)
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=64).save_pretrained(other)
    env = {**hpl_env, "HPL_MODELS_DIR": str(tmp_path / "models")}
    assert _prepare(tmp_path, env) == 2
    assert "lora.target_modules: q_proj, k_proj, v_proj" in _one_error_line(capsys)
    assert _prepare(tmp_path, hpl_env) == 0
    assert "lora.target_modules: all in the model" in capsys.readouterr().out


def test_a_full_fine_tuning_load_the_node_cannot_hold_stops_at_prepare(hpl_env, tmp_path, monkeypatch, capsys):
    """Llama 3 8B's shape (config.json alone), 64 ranks on a 2,048 GiB trn2.48xlarge: DDP loads 64 fp32
    copies and is refused in one line; FSDP loads once and passes."""
    import json

    from test_neuron_full import LLAMA3_8B

    model = tmp_path / "llama3-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA3_8B, "model_type": "llama"}))
    monkeypatch.setenv("HPL_HOST_MEMORY_GIB", "2048")
    _offline(monkeypatch)  # the Hub checks come after; they are not what this test is about
    runs = {
        strategy: write_config(
            tmp_path / f"{strategy}.toml",
            hpl_env,
            train={"method": "full", "save_checkpoints": False},
            parallel={"devices_per_node": 64, "strategy": strategy},
            paths={"model_dir": str(model)},
        )
        for strategy in ("ddp", "fsdp")
    }
    assert prepare.main(["--config", str(runs["ddp"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "64 copies (every rank) of 29.9 GiB: ~2,043 GiB" in err and "does not fit" in err
    assert prepare.main(["--config", str(runs["fsdp"])]) == 0
    assert "one copy (rank 0 loads, the others receive shards) of 29.9 GiB: ~158 GiB" in capsys.readouterr().out
