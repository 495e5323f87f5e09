"""A resubmitted finished run does nothing (no recompile, no extra zero-LR step); a longer one trains on
(test_run_state.py has the rest of a run's states)."""

from __future__ import annotations

import dataclasses
import json

from payload_configs import tiny_config

from llm_pipeline import run_state, train


def _finished_checkpoint(cfg, step: int) -> None:
    folder = cfg.paths.checkpoints_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": step}))
    run_state.record_finished(cfg.paths.checkpoints_dir, step, cfg.learned())


def test_finished_run_is_left_alone_for_train_and_precompile(hpl_env, capsys):
    cfg = tiny_config(hpl_env)
    _finished_checkpoint(cfg, 30)
    for precompile in (False, True):
        train.train(cfg, "torch", precompile=precompile)
        assert "training already finished at step 30" in capsys.readouterr().out
    assert not cfg.paths.data_dir.exists() and not cfg.paths.tensorboard_dir.exists()  # nothing was loaded


def test_a_longer_config_or_a_newer_checkpoint_trains_on(hpl_env):
    cfg = _finished(hpl_env)
    assert run_state.finished_already(train.read_run(cfg, "torch").end)
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=60))
    assert not run_state.finished_already(train.read_run(longer, "torch").end)
    newer = cfg.paths.checkpoints_dir / "checkpoint-40"
    newer.mkdir()
    (newer / "trainer_state.json").write_text("{}")
    # the marker names another step than the newest checkpoint
    assert not run_state.finished_already(train.read_run(cfg, "torch").end)


def _finished(hpl_env):
    cfg = tiny_config(hpl_env)
    _finished_checkpoint(cfg, 30)
    return cfg
