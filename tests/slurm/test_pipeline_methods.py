"""The rehearsal's --method: every train.method gets a valid run config, and the whole pipeline runs
with full fine-tuning (consolidate writes the model folder, merge has nothing to do, generate uses it)."""

from __future__ import annotations

import re

import pytest
from slurm_helpers import REPO, submit

from llm_pipeline import config
from llm_pipeline.config import METHODS
from tools.rehearse import fsx_environment, method_config, write_inputs

pytestmark = pytest.mark.xdist_group("slurm")
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


@pytest.mark.parametrize("method", METHODS)
def test_rehearsal_config_for_each_method(tmp_path, method):
    path = method_config(TINY, method, tmp_path)
    env = {name: str(tmp_path) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    cfg = config.load(path, env=env)
    assert cfg.train.method == method
    assert cfg.train.backend == "torch"  # the rehearsal's CPU backend runs every method
    config.check_backend(cfg, "torch")
    (tmp_path / "again").mkdir()
    twice = method_config(path, "lora", tmp_path / "again")
    assert config.load(twice, env=env).train.method == "lora"  # an existing method line is replaced


def test_pipeline_runs_full_fine_tuning_end_to_end(one_node, tmp_path):
    env = one_node.env(fsx_environment(tmp_path / "fsx"))
    path = method_config(TINY, "full", tmp_path)
    path.write_text(re.sub(r"(?m)^max_steps = .*$", "max_steps = 6", path.read_text()))
    write_inputs(path, env, records=80)
    result = submit(env, path, "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    out_dir = config.load(path, env=env).paths
    logs = {p.name.split("-")[0]: p.read_text() for p in (out_dir.logs_dir).glob("*-*.log")}
    assert "method full: 87,360 trainable parameters" in logs["train"]
    assert f"model folder written to {out_dir.merged_dir}" in logs["consolidate"]
    assert "nothing to merge for train.method full" in logs["merge"]
    assert not out_dir.adapter_dir.exists()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out_dir.merged_dir.iterdir()}
    assert str(out_dir.merged_dir) in logs["generate"]
    assert "### Answer" in out_dir.generation_file.read_text()
