"""Download step logic on real files: token lookup, completeness, dtype conversion, Hub errors.

The Hub itself is out of reach here; its answers for a gated and an unknown model come from a
small local HTTP server that speaks the model-info endpoint.
"""

from __future__ import annotations

import json
import shutil

import pytest
from hub_stub import FakeHub
from payload_configs import tiny_config

from llm_pipeline import download
from llm_pipeline.errors import StepError
from llm_pipeline.weights import model_files
from tests.local_http import serving
from tools import tiny_model as tiny


def test_token_from_environment_first(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    assert download.find_token({"HF_TOKEN": "from-env", "HF_HOME": str(tmp_path)}) == "from-env"
    assert download.find_token({"HUGGING_FACE_HUB_TOKEN": "old-name"}) == "old-name"


def test_token_from_the_login_file(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    assert download.find_token({"HF_HOME": str(tmp_path)}) == "from-file"
    assert download.find_token({"HF_HOME": str(tmp_path / "elsewhere")}) is None
    assert download.find_token({"HF_TOKEN": "  ", "HF_HOME": str(tmp_path / "elsewhere")}) is None


def test_gated_model_without_token_is_refused():
    download.check_access("org/open-model", False, None)
    download.check_access("meta-llama/Meta-Llama-3-8B", "manual", "hf_x")
    with pytest.raises(StepError, match=r"gated model and no Hugging Face token.*HF_TOKEN"):
        download.check_access("meta-llama/Meta-Llama-3-8B", "manual", None)


@pytest.fixture
def model_copy(tiny_models_dir, tmp_path):
    return shutil.copytree(tiny_models_dir / "tiny-llama", tmp_path / "model")


def test_completeness_of_a_model_folder(model_copy):
    assert model_files.is_complete(model_copy, "float32")
    assert not model_files.is_complete(model_copy, "bfloat16")  # complete files, wrong dtype
    (model_copy / "tokenizer.json").unlink()
    assert model_files.missing_parts(model_copy) == ["tokenizer.json or tokenizer.model"]


def test_truncated_or_missing_shard_is_incomplete(tmp_path):
    folder = tmp_path / "sharded"
    tiny.write_tiny_model(folder)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, max_shard_size="100KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    shards = model_files.weight_files(folder)
    assert len(shards) > 1 and model_files.is_complete(folder, "float32")
    shards[0].write_bytes(shards[0].read_bytes()[:-10])
    assert not model_files.is_complete(folder, "float32")
    shards[1].unlink()
    assert model_files.missing_parts(folder) == [shards[1].name]


def test_fp32_weights_are_converted_to_bf16_shard_by_shard(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    tiny.write_tiny_model(folder)
    original = AutoModelForCausalLM.from_pretrained(folder)
    original.save_pretrained(folder, max_shard_size="100KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    messages = []
    converted = model_files.convert_dtype(folder, "bfloat16", progress=messages.append)
    assert converted == len(model_files.weight_files(folder)) > 1
    assert len(messages) == converted  # one progress line per shard
    assert model_files.is_complete(folder, "bfloat16")
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(p.numel() * 2 for p in original.parameters())
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")  # what config.json says
    assert reloaded.dtype == torch.bfloat16
    for (name, before), after in zip(original.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(before.to(torch.bfloat16), after), name
    assert model_files.convert_dtype(folder, "bfloat16") == 0  # nothing left to convert


def test_complete_folder_is_not_downloaded_again(hpl_env, capsys):
    cfg = tiny_config(hpl_env)  # model.dtype float32, the tiny model is saved in float32
    # An endpoint nobody listens on: any Hub access would fail the step.
    assert download.download(cfg, endpoint="http://127.0.0.1:9") == download.Path(cfg.paths.model_dir)
    assert "nothing to download" in capsys.readouterr().out


@pytest.fixture
def fake_hub():
    with serving(FakeHub) as url:
        yield url


def test_gated_model_without_token_stops_before_downloading(fake_hub, tmp_path):
    with pytest.raises(StepError, match="org/gated-model is a gated model and no Hugging Face token"):
        download.fetch("org/gated-model", "main", tmp_path / "model", None, endpoint=fake_hub)
    assert not any((tmp_path / "model").glob("*"))


def test_unknown_or_unauthorised_model_is_a_clear_error(fake_hub, tmp_path):
    with pytest.raises(StepError, match=r"org/private-model not found or not accessible.*set HF_TOKEN"):
        download.fetch("org/private-model", "main", tmp_path / "model", None, endpoint=fake_hub)
    with pytest.raises(StepError, match=r"not found or not accessible.*check model\.id$"):
        download.fetch("org/private-model", "main", tmp_path / "model", "hf_good_token", endpoint=fake_hub)
    with pytest.raises(StepError, match=r"rejected the Hugging Face token.*check HF_TOKEN"):
        download.fetch("org/private-model", "main", tmp_path / "model", "hf_bad_token", endpoint=fake_hub)


def test_download_cli_turns_hub_errors_into_exit_2(fake_hub, hpl_env, tmp_path, capsys, monkeypatch):
    from payload_configs import write_config

    path = write_config(
        tmp_path / "run.toml",
        hpl_env,
        model={"id": "org/gated-model", "dtype": "bfloat16"},
        paths={"model_dir": str(tmp_path / "model")},
    )
    monkeypatch.setenv("HF_ENDPOINT", fake_hub)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert download.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: org/gated-model is a gated model")


def test_the_model_config_reader_every_step_shares(tmp_path):
    assert model_files.read_model_config(tmp_path) is None  # not downloaded yet: nothing to check against
    (tmp_path / "config.json").write_text('{"num_key_value_heads": 8}')
    assert model_files.read_model_config(tmp_path) == {"num_key_value_heads": 8}
    (tmp_path / "config.json").write_text('{"num_key_value_heads": ')
    with pytest.raises(StepError, match=r"config.json is not valid JSON .*: download the model again"):
        model_files.read_model_config(tmp_path)
