"""merge: bad inputs stop before anything is written, and an interrupted merge leaves no output."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.synthetic_llama import LlamaShape, write_adapter, write_model
from llm_pipeline import merge
from llm_pipeline.errors import CheckpointError

pytestmark = pytest.mark.both_stacks

SMALL = LlamaShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=128, tied=False)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "base", SMALL, max_shard_size="40KB")


def test_truncated_shard_is_named(tmp_path, model):
    adapter = write_adapter(tmp_path / "adapter", SMALL)
    shard = sorted(model.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=rf"{shard.name} is truncated"):
        merge.merge(model, adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_shard_is_named(tmp_path, model):
    adapter = write_adapter(tmp_path / "adapter", SMALL)
    sorted(model.glob("model-*.safetensors"))[0].unlink()
    with pytest.raises(CheckpointError, match=r"model-00001-of-.*is missing"):
        merge.merge(model, adapter, tmp_path / "out")


def test_adapter_for_another_shape_names_the_module(tmp_path, model):
    other = LlamaShape(hidden=96, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=128, tied=False)
    adapter = write_adapter(tmp_path / "adapter", other, targets=("v_proj",))
    with pytest.raises(
        CheckpointError, match=r"adapter module model.layers.0.self_attn.v_proj does not fit .* another model"
    ):
        merge.merge(model, adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_adapter_for_another_architecture_names_the_module(tmp_path, model):
    tied = write_model(tmp_path / "tied", LlamaShape(**{**SMALL.__dict__, "tied": True}))
    adapter = write_adapter(tmp_path / "adapter", SMALL, targets=("q_proj", "lm_head"))
    with pytest.raises(
        CheckpointError, match=r"adapter module lm_head has no base tensor lm_head.weight .* ties lm_head"
    ):
        merge.merge(tied, adapter, tmp_path / "out")
    deeper = write_adapter(tmp_path / "deeper", LlamaShape(**{**SMALL.__dict__, "layers": 3}))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.self_attn\.q_proj has no base tensor"):
        merge.merge(model, deeper, tmp_path / "out")


def test_unsupported_adapter_options_are_refused(tmp_path, model):
    adapter = write_adapter(tmp_path / "adapter", SMALL)
    config = adapter / "adapter_config.json"
    config.write_text(config.read_text().replace('"lora_bias": false', '"lora_bias": true'))
    with pytest.raises(CheckpointError, match="LoRA bias"):
        merge.merge(model, adapter, tmp_path / "out")


def test_cli_refuses_non_empty_output_and_inputs_as_output(tmp_path, model, capsys):
    adapter = write_adapter(tmp_path / "adapter", SMALL)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("keep")
    args = ["--config", str(_config(tmp_path)), "--base", str(model), "--adapter", str(adapter)]
    assert merge.main([*args, "--output", str(out)]) == 2
    assert "error: output folder" in capsys.readouterr().err and (out / "old.txt").is_file()
    assert merge.main([*args, "--output", str(model), "--overwrite"]) == 2
    assert "would overwrite the input" in capsys.readouterr().err and (model / "config.json").is_file()
    assert merge.main([*args, "--output", str(out), "--overwrite"]) == 0
    assert not (out / "old.txt").exists() and (out / "model.safetensors.index.json").is_file()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[paths]\noutput_dir = "{tmp_path / "run"}"\n')
    return path


def _start_merge(tmp_path: Path, base: Path, adapter: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "payloads"), str(REPO)])}
    command = [
        sys.executable,
        "-m",
        "llm_pipeline.merge",
        "--config",
        str(_config(tmp_path)),
        "--base",
        str(base),
        "--adapter",
        str(adapter),
        "--output",
        str(out),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
    return process


def _stop_reading_after_first_shard(process: subprocess.Popen) -> None:
    """Read the merge's output up to its first shard line, then read no more: its progress lines
    soon fill the one-page pipe and block it, mid-merge, until the test signals it."""
    line = b""
    while not line.startswith(b"[1/"):
        line = b""
        while not line.endswith(b"\n"):
            byte = os.read(process.stdout.fileno(), 1)
            assert byte, f"merge ended early: {process.wait()} {process.stderr.read().decode()}"
            line += byte
    shards = int(line.split(b"/")[1].split(b"]")[0])
    assert shards * len(line) > 2 * 4096, "too few shards to fill the pipe"


@pytest.fixture
def many_shards(tmp_path):
    shape = LlamaShape(hidden=256, intermediate=512, layers=16, heads=4, kv_heads=2, vocab=2048, tied=False)
    base = write_model(tmp_path / "big", shape, max_shard_size="100KB")  # about 100 shards
    return base, write_adapter(tmp_path / "big-adapter", shape, targets=("q_proj", "v_proj", "down_proj"))


def test_merge_terminated_half_way_leaves_nothing(tmp_path, many_shards):
    out = tmp_path / "merged"
    process = _start_merge(tmp_path, *many_shards, out)
    _stop_reading_after_first_shard(process)
    assert list(tmp_path.glob(".merged.partial-*")) and not out.exists()  # mid-merge
    process.send_signal(signal.SIGTERM)
    assert process.wait() == 2
    assert "interrupted by SIGTERM; nothing was written" in process.stderr.read().decode()
    assert not out.exists() and not list(tmp_path.glob(".merged.partial-*"))


def test_merge_killed_half_way_leaves_no_output_and_the_next_run_cleans_up(tmp_path, many_shards):
    out = tmp_path / "merged"
    process = _start_merge(tmp_path, *many_shards, out)
    _stop_reading_after_first_shard(process)
    process.kill()
    assert process.wait() == -signal.SIGKILL
    assert not out.exists()
    (partial,) = tmp_path.glob(".merged.partial-*")  # hidden, beside the output; never the output itself
    rerun = _start_merge(tmp_path, *many_shards, out)
    stdout, stderr = rerun.communicate()
    assert rerun.returncode == 0, stderr
    assert f"removing {partial} left by an interrupted run" in stdout.decode()
    assert not partial.exists() and (out / "model.safetensors.index.json").is_file()


def _name_base_model(adapter: Path, named: str) -> None:
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "base_model_name_or_path": named}))


@pytest.mark.parametrize(
    ("named", "refused"),
    [
        ("{base}", False),  # the folder training loaded (the pipeline's case)
        ("meta-llama/base", False),  # the Hub id the download step named the folder after
        ("meta-llama/Meta-Llama-3-8B-Instruct", True),  # same shapes, another model
    ],
)
def test_adapter_trained_on_another_model_is_refused_unless_allowed(tmp_path, model, capsys, named, refused):
    adapter = write_adapter(tmp_path / "adapter", SMALL)
    _name_base_model(adapter, named.format(base=model))
    if not refused:
        merge.merge(model, adapter, tmp_path / "out")
        assert "warning" not in capsys.readouterr().out
        return
    with pytest.raises(
        CheckpointError, match=r"trained on 'meta-llama/Meta-Llama-3-8B-Instruct' .* --allow-other-base"
    ):
        merge.merge(model, adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    merge.merge(model, adapter, tmp_path / "out", allow_other_base=True)
    assert "warning: the adapter" in capsys.readouterr().out and (tmp_path / "out").is_dir()
