"""The ladder's checkpoint storage: sizes per rung from the job files, the retention, the prepare check."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from torchtitan_site import REPO, site_env

from llm_pipeline import config
from llm_pipeline.errors import StepError
from llm_pipeline.training.torchtitan import ladder, storage

CONFIGS = REPO / "payloads" / "configs"
LLAMA3_8B = 8_030_261_248  # torchtitan 0.2.2's llama3 "8B" flavor (test_flavor_size_comes_from_torchtitan)
GIB = 2**30


def pretrain_config(tmp_path: Path, **torchtitan) -> config.RunConfig:
    env = {"HPL_OUTPUTS_DIR": str(tmp_path), "HPL_MODELS_DIR": str(tmp_path), "HPL_DATASETS_DIR": str(tmp_path)}
    cfg = config.load(CONFIGS / "llama3-8b-pretrain.toml", env=env)
    return dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, **torchtitan))


def test_flavor_size_comes_from_torchtitan():
    code = (
        "import json, llm_pipeline.training.torchtitan.flavors; "
        "from llm_pipeline.training.torchtitan.storage import flavor_parameters as f; "
        "print(json.dumps([f('llama3', '8B'), f('llama3', 'debugmodel'), f('llama3_ladder', '1B')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=site_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the 1B flavor: Llama 3.2 1B's shape with an untied output projection
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [LLAMA3_8B, 6_163_712, 1_498_482_688]


def test_an_8b_rung_holds_about_195_gib_and_the_retention_decides_what_stays(tmp_path):
    everything = pretrain_config(tmp_path, checkpoint_retention="all")
    rung = storage.rung_storage(everything, "baseline", LLAMA3_8B)
    # interval 500 over 2000 steps, keep_latest_k 2: two full saves (12 bytes/parameter) + the bf16 final
    assert rung.peak == 2 * 12 * LLAMA3_8B + 2 * LLAMA3_8B and round(rung.peak / GIB, 1) == 194.4
    rungs = [storage.rung_storage(everything, r, LLAMA3_8B) for r in everything.torchtitan.rungs]
    assert round(storage.ladder_peak(rungs) / GIB) == 778  # every rung keeps all: the issue's ~780 GiB
    last = pretrain_config(tmp_path, checkpoint_retention="last")
    rungs = [storage.rung_storage(last, r, LLAMA3_8B) for r in last.torchtitan.rungs]
    assert [round(r.kept / GIB, 1) for r in rungs] == [15.0] * 4
    assert round(storage.ladder_peak(rungs) / GIB) == 194 + 45  # the last rung in flight + three finals
    none = pretrain_config(tmp_path, checkpoint_retention="none")
    assert [storage.rung_storage(none, r, LLAMA3_8B).kept > 0 for r in none.torchtitan.rungs] == [False] * 3 + [True]


def test_prepare_refuses_a_ladder_the_file_system_cannot_hold(tmp_path):
    cfg = pretrain_config(tmp_path, checkpoint_retention="all")
    assert "the ladder needs" in storage.check(cfg, parameters=1000)
    with pytest.raises(StepError) as refused:
        storage.check(cfg, parameters=10**13)  # petabytes of checkpoints
    message = str(refused.value)
    assert "the ladder's checkpoints do not fit" in message and "checkpoint_retention = 'all'" in message
    assert 'set torchtitan.checkpoint_retention = "last"' in message and "fsx_storage_capacity_gib" in message


def save_steps(cfg: config.RunConfig, rung: str, *steps: int, complete: bool = True) -> Path:
    folder = ladder.rung_dir(cfg, rung) / "checkpoint"
    for step in steps:
        (folder / f"step-{step}").mkdir(parents=True)
        (folder / f"step-{step}" / "__0_0.distcp").write_bytes(b"x" * 1000)
        if complete:
            (folder / f"step-{step}" / ".metadata").write_bytes(b"dcp")
    return folder


def test_retention_keeps_the_final_step_then_none_once_metrics_are_read(tmp_path):
    cfg = pretrain_config(tmp_path, checkpoint_retention="last")
    folder = save_steps(cfg, "baseline", 1000, 1500, 2000)
    save_steps(cfg, "baseline", 2500, complete=False)  # an interrupted save
    assert storage.retain(cfg, "baseline", metrics_read=False) == 2 * 1003 + 1000  # step-1000, 1500 and 2500
    assert [p.name for p in folder.iterdir()] == ["step-2000"]
    assert storage.retain(cfg, "baseline", metrics_read=True) == 0  # "last" keeps it for good

    none = pretrain_config(tmp_path, checkpoint_retention="none")
    storage.retain(none, "baseline", metrics_read=True)
    assert list(folder.iterdir()) == []
    exported = save_steps(none, "fp8_allgather", 2000)
    storage.retain(none, "fp8_allgather", metrics_read=True)  # the export reads it after the report
    assert [p.name for p in exported.iterdir()] == ["step-2000"]

    everything = pretrain_config(tmp_path, checkpoint_retention="all")
    save_steps(everything, "compile", 1000, 2000)
    assert storage.retain(everything, "compile", metrics_read=True) == 0
