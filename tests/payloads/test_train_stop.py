"""train.stop_after_step (the smoke stage's saving run): it stops with a checkpoint while keeping the whole
run's learning-rate schedule, so the run resumed from that checkpoint trains its later steps at the learning
rates, and to the losses, of a run that never stopped. A run cut with max_steps instead would decay to 0."""

from __future__ import annotations

import json

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import config, train
from llm_pipeline.config import ConfigError
from llm_pipeline.jobs import smoke
from llm_pipeline.jobs.run_facts import read_run_facts

pytestmark = pytest.mark.engine

SHAPE = {"max_steps": smoke.SMOKE_STEPS, "save_steps": smoke.SAVE_STEP, "logging_steps": 1, "warmup_steps": 1}


def _logged(checkpoint) -> dict[int, dict]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry for entry in history if "loss" in entry}


def _run(tmp_path, hpl_env, name: str, **train_keys) -> None:
    env = {**hpl_env, "HPL_OUTPUTS_DIR": str(tmp_path / name)}
    path = write_config(tmp_path / f"{name}.toml", env, data={"validation_fraction": 0.0}, train=train_keys)
    assert train.main(["--prepare-data", "--config", str(path)]) == 0


def test_a_run_resumed_after_stop_after_step_trains_on_the_uninterrupted_schedule(hpl_env, tmp_path, capsys):
    _run(tmp_path, hpl_env, "whole", **SHAPE)
    _run(tmp_path, hpl_env, "stopped", **SHAPE, stop_after_step=smoke.SAVE_STEP)
    checkpoints = tmp_path / "stopped" / "tiny-lora" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == [f"checkpoint-{smoke.SAVE_STEP}"]
    _run(tmp_path, hpl_env, "stopped", **SHAPE)  # the smoke stage's resume: the same run without the stop
    out = capsys.readouterr().out
    assert f"resuming from {checkpoints / f'checkpoint-{smoke.SAVE_STEP}'}" in out

    whole = _logged(tmp_path / "whole" / "tiny-lora" / "checkpoints" / f"checkpoint-{smoke.SMOKE_STEPS}")
    resumed = _logged(checkpoints / f"checkpoint-{smoke.SMOKE_STEPS}")
    assert sorted(resumed) == sorted(whole) == list(range(1, smoke.SMOKE_STEPS + 1))
    for step in range(1, smoke.SMOKE_STEPS + 1):
        assert resumed[step]["learning_rate"] == whole[step]["learning_rate"], step
        assert resumed[step]["loss"] == pytest.approx(whole[step]["loss"], abs=1e-3), step
    assert resumed[smoke.SAVE_STEP + 1]["learning_rate"] > 0


def test_stop_after_step_needs_a_checkpoint_and_a_later_end(hpl_env):
    for keys in ({"stop_after_step": 30}, {"stop_after_step": 2, "save_checkpoints": False}, {"stop_after_step": -1}):
        with pytest.raises(ConfigError, match=r"train\.stop_after_step"):
            tiny_config(hpl_env, train=keys)


def test_the_smoke_stage_saving_config_stops_on_the_whole_smoke_schedule(hpl_env, tmp_path):
    path = write_config(tmp_path / "run.toml", hpl_env)
    smoke.write_smoke_run(read_run_facts(path, hpl_env))
    folder = tmp_path / "outputs" / "tiny-lora" / smoke.SMOKE_FOLDER
    saving, whole = (config.load(folder / name, env=hpl_env).train for name in smoke.CONFIGS)
    assert (saving.max_steps, saving.stop_after_step) == (smoke.SMOKE_STEPS, smoke.SAVE_STEP)
    assert (whole.max_steps, whole.stop_after_step) == (smoke.SMOKE_STEPS, 0)


def test_a_finished_run_extended_with_more_steps_trains_its_first_new_step_on_the_new_schedule(hpl_env, tmp_path):
    # The first run's schedule ends at lr 0 and its optimizer state carries that lr; the extended run's schedule
    # must set the lr of its first new step, or that step trains at lr 0 (seen on a GPU run).
    first = {**SHAPE, "max_steps": smoke.SAVE_STEP, "lr_scheduler": "linear", "warmup_steps": 0}
    _run(tmp_path, hpl_env, "run", **first)
    checkpoints = tmp_path / "run" / "tiny-lora" / "checkpoints"
    _run(tmp_path, hpl_env, "run", **{**first, "max_steps": smoke.SMOKE_STEPS})
    extended = _logged(checkpoints / f"checkpoint-{smoke.SMOKE_STEPS}")
    learning_rate = config.load(tmp_path / "run.toml", env=hpl_env).train.learning_rate
    # linear decay from the configured lr over the new max_steps, the old steps counted: step k trains at
    # lr * (1 - (k - 1) / max_steps), and the value logged at step k is the one its optimizer step used
    new_steps = range(smoke.SAVE_STEP + 1, smoke.SMOKE_STEPS + 1)
    expected = [learning_rate * (1 - (step - 1) / smoke.SMOKE_STEPS) for step in new_steps]
    assert [extended[step]["learning_rate"] for step in new_steps] == pytest.approx(expected, rel=1e-6)
