"""A resubmitted finished run does nothing (no recompile, no extra zero-LR step); a changed one trains on."""

from __future__ import annotations

import dataclasses
import json

from payload_configs import tiny_config

from llm_pipeline import train


def _finished_checkpoint(cfg, step: int) -> None:
    folder = cfg.paths.checkpoints_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": step}))
    train.record_finished(cfg, step)


def test_finished_run_is_left_alone_for_train_and_precompile(hpl_env, capsys):
    cfg = tiny_config(hpl_env)
    _finished_checkpoint(cfg, 30)
    for precompile in (False, True):
        train.train(cfg, "torch", precompile=precompile)
        assert "training already finished at step 30 with this config" in capsys.readouterr().out
    assert not cfg.paths.data_dir.exists() and not cfg.paths.tensorboard_dir.exists()  # nothing was loaded


def test_a_changed_config_or_a_newer_checkpoint_trains_on(hpl_env):
    cfg = tiny_config(hpl_env)
    _finished_checkpoint(cfg, 30)
    assert train.finished_step(cfg) == 30
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=60))
    assert train.finished_step(longer) is None
    newer = cfg.paths.checkpoints_dir / "checkpoint-40"
    newer.mkdir()
    (newer / "trainer_state.json").write_text("{}")
    assert train.finished_step(cfg) is None  # the marker names another step than the newest checkpoint
