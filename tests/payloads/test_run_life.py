"""The torch engine through a run's life: a NaN step within the grace is skipped (its update never reaches the
weights or the optimizer state), a NaN at the last step stops the run unmarked, a finished run resubmitted trains
nothing. test_run_state.py drives the same rules through every history with a stand-in engine."""

from __future__ import annotations

import json

import pytest
import torch
from payload_configs import write_config
from safetensors.torch import load_file
from transformers import TrainerCallback

from llm_pipeline import run_state, train
from llm_pipeline.training.torch import backend

pytestmark = pytest.mark.engine

SHAPE = {"save_steps": 2, "save_total_limit": 10, "logging_steps": 1, "lr_scheduler": "linear"}


def _poison_loss(monkeypatch, step: int, value: float = float("nan")) -> None:
    """A non-finite loss at ``step`` only (a bad batch), through the engine's own trainer."""
    built = backend.build_trainer

    def poisoned(*args, **kwargs):
        trainer, tokens = built(*args, **kwargs)
        compute = trainer.compute_loss

        def compute_loss(model, inputs, *rest, **options):
            out = compute(model, inputs, *rest, **options)
            if trainer.state.global_step + 1 != step:
                return out
            return (out[0] * value, *out[1:]) if isinstance(out, tuple) else out * value

        trainer.compute_loss = compute_loss
        return trainer, tokens

    monkeypatch.setattr(backend, "build_trainer", poisoned)


class SkipByHand(TrainerCallback):
    """The reference: at ``step`` neither the optimizer nor the learning-rate schedule steps (no guard involved)."""

    def __init__(self, trainer, step: int):
        self.trainer, self.step = trainer, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            for part in (self.trainer.optimizer, self.trainer.lr_scheduler):
                part.step = lambda *args, **kwargs: None

    def on_step_end(self, args, state, control, **kwargs):
        for part in (self.trainer.optimizer, self.trainer.lr_scheduler):
            vars(part).pop("step", None)  # the class's own again, before the checkpoint saves the schedule


def _skip_update_by_hand(monkeypatch, step: int) -> None:
    built = backend.build_trainer

    def skipping(*args, **kwargs):
        trainer, tokens = built(*args, **kwargs)
        trainer.add_callback(SkipByHand(trainer, step))
        return trainer, tokens

    monkeypatch.setattr(backend, "build_trainer", skipping)


def _run(tmp_path, env, name: str, **train_keys) -> int:
    env = {**env, "HPL_OUTPUTS_DIR": str(tmp_path / name)}
    path = write_config(tmp_path / f"{name}.toml", env, data={"validation_fraction": 0.0}, train=train_keys)
    return train.main(["--prepare-data", "--config", str(path)])


def _checkpoints(tmp_path, name):
    return tmp_path / name / "tiny-lora" / "checkpoints"


def test_a_nan_at_step_4_within_the_grace_is_skipped_as_if_the_step_never_updated(hpl_env, tmp_path, monkeypatch):
    _poison_loss(monkeypatch, 4)
    assert _run(tmp_path, hpl_env, "nan", **SHAPE, max_steps=6, nonfinite_loss_grace=2) == 0
    monkeypatch.undo()
    _skip_update_by_hand(monkeypatch, 4)
    assert _run(tmp_path, hpl_env, "skipped", **SHAPE, max_steps=6) == 0

    nan, skipped = _checkpoints(tmp_path, "nan"), _checkpoints(tmp_path, "skipped")
    history = json.loads((nan / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    losses = {entry["step"]: entry["loss"] for entry in history if "loss" in entry}
    assert losses[4] != losses[4]  # logged as NaN
    assert all(torch.isfinite(torch.tensor(losses[step])) for step in (5, 6))
    reference = json.loads((skipped / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    rates = [[entry["learning_rate"] for entry in log if "loss" in entry] for log in (history, reference)]
    assert rates[0] == rates[1] and rates[0][3] == rates[0][4]  # the schedule waited at the skipped step
    assert not (nan / "checkpoint-4").exists()  # a bad step gets no checkpoint
    assert run_state.read_finished(nan).step == 6
    for name in ("adapter_model.safetensors",):
        ours, reference = load_file(nan / "checkpoint-6" / name), load_file(skipped / "checkpoint-6" / name)
        assert ours.keys() == reference.keys()
        for key in ours:
            assert torch.equal(ours[key], reference[key]), key
    ours = torch.load(nan / "checkpoint-6" / "optimizer.pt", weights_only=True)["state"]
    reference = torch.load(skipped / "checkpoint-6" / "optimizer.pt", weights_only=True)["state"]
    for index in reference:
        for key in reference[index]:
            assert torch.equal(ours[index][key], reference[index][key]), (index, key)


def test_a_nan_at_the_last_step_within_the_grace_exits_2_unmarked_and_resumable(hpl_env, tmp_path, monkeypatch, capsys):
    _poison_loss(monkeypatch, 4)
    assert _run(tmp_path, hpl_env, "run", **SHAPE, max_steps=4, nonfinite_loss_grace=1) == 2
    err = capsys.readouterr().err
    assert "the loss is nan at step 4 (the run's last step" in err
    assert "resubmitting resumes from the newest checkpoint" in err and "checkpoint-2" in err
    checkpoints = _checkpoints(tmp_path, "run")
    assert run_state.read_finished(checkpoints) is None
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-2"]


def test_a_finished_run_resubmitted_with_logging_changed_trains_no_step_past_its_end(hpl_env, tmp_path, capsys):
    assert _run(tmp_path, hpl_env, "run", **SHAPE, max_steps=3, learning_rate=1e-3) == 0
    checkpoints = _checkpoints(tmp_path, "run")
    written = (checkpoints / "checkpoint-3" / "adapter_model.safetensors").read_bytes()
    capsys.readouterr()
    assert _run(tmp_path, hpl_env, "run", **{**SHAPE, "logging_steps": 2}, max_steps=3, learning_rate=1e-3) == 0
    out = capsys.readouterr().out
    assert "training already finished at step 3" in out and "step 4/3" not in out
    assert (checkpoints / "checkpoint-3" / "adapter_model.safetensors").read_bytes() == written
    assert not (checkpoints / "checkpoint-4").exists()
    assert _run(tmp_path, hpl_env, "run", **SHAPE, max_steps=3, learning_rate=2e-3) == 2
    assert "train.learning_rate (finished with 0.001, now 0.002)" in capsys.readouterr().err
