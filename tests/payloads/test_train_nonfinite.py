"""A NaN or Inf loss stops training at that step with one error line (exit 2), and the checkpoint kept is the
last one written before it: never a run that logs `loss 0.0000` over a broken model and exits 0."""

from __future__ import annotations

import shutil

import pytest
import torch
from payload_configs import write_config
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from llm_pipeline import cli, train
from llm_pipeline.training.loss_guard import NonFiniteLoss, NonFiniteLossGuard, StopAtNonFiniteLoss
from llm_pipeline.training.torch import backend

pytestmark = pytest.mark.engine


def _poisoned_model(tiny_models_dir, tmp_path):
    """The tiny model with one NaN in its final norm weight: every forward gives a NaN loss."""
    folder = tmp_path / "models" / "tiny-llama"
    shutil.copytree(tiny_models_dir / "tiny-llama", folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.norm.weight"][3] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    return tmp_path / "models"


def _train(tmp_path, env, **train_keys) -> int:
    path = write_config(tmp_path / "run.toml", env, data={"validation_fraction": 0.0}, train=train_keys)
    return train.main(["--prepare-data", "--config", str(path)])


def _checkpoints(env):
    from pathlib import Path

    folder = Path(env["HPL_OUTPUTS_DIR"]) / "tiny-lora" / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))


def test_a_base_model_with_a_nan_weight_stops_at_step_1(hpl_env, tiny_models_dir, tmp_path, capsys):
    env = {**hpl_env, "HPL_MODELS_DIR": str(_poisoned_model(tiny_models_dir, tmp_path))}
    assert _train(tmp_path, env, max_steps=4, save_steps=1, logging_steps=1) == 2
    err = capsys.readouterr().err
    assert "error: training stopped: the loss is nan at step 1 (1 step(s) in a row" in err
    assert "no checkpoint was saved" in err
    assert _checkpoints(env) == []


def test_within_the_grace_a_nan_loss_is_logged_as_nan_and_not_saved(hpl_env, tiny_models_dir, tmp_path, capsys):
    env = {**hpl_env, "HPL_MODELS_DIR": str(_poisoned_model(tiny_models_dir, tmp_path))}
    assert _train(tmp_path, env, max_steps=5, save_steps=1, logging_steps=1, nonfinite_loss_grace=2) == 2
    out, err = capsys.readouterr()
    assert "step 1/5 | loss nan" in out and "step 2/5 | loss nan" in out
    assert "loss 0.0000" not in out
    assert "the loss is nan at step 3 (3 step(s) in a row; train.nonfinite_loss_grace = 2)" in err
    assert _checkpoints(env) == []  # steps 1 and 2 were within the grace but not worth keeping


class PoisonAfterStep(TrainerCallback):
    """Stands in for a divergence: a NaN in one trainable weight as step ``step`` + 1 begins."""

    def __init__(self, model, step: int):
        self.model, self.step = model, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            weight = next(p for p in self.model.parameters() if p.requires_grad)
            with torch.no_grad():
                weight.view(-1)[0] = float("nan")


def test_a_loss_that_turns_nan_mid_run_stops_there_keeping_the_last_good_checkpoint(
    hpl_env, tmp_path, monkeypatch, capsys
):
    built = backend.build_trainer

    def poisoned(*args, **kwargs):
        trainer, tokens = built(*args, **kwargs)
        trainer.add_callback(PoisonAfterStep(trainer.model, 3))
        return trainer, tokens

    monkeypatch.setattr(backend, "build_trainer", poisoned)
    path = write_config(
        tmp_path / "run.toml",
        hpl_env,
        data={"validation_fraction": 0.0},
        train={"max_steps": 8, "save_steps": 1, "save_total_limit": 8, "logging_steps": 1},
    )
    with pytest.raises(SystemExit) as stop:  # the CLI's exit path, as the Slurm step runs it
        cli.exit_step(train.main(["--prepare-data", "--config", str(path)]))
    assert stop.value.code == 2
    assert _checkpoints(hpl_env) == [1, 2, 3]
    assert "training stopped: the loss is nan at step 4 (1 step(s) in a row" in capsys.readouterr().err
    adapter = load_file(
        tmp_path / "outputs" / "tiny-lora" / "checkpoints" / "checkpoint-3" / "adapter_model.safetensors"
    )
    assert all(torch.isfinite(tensor).all() for tensor in adapter.values())


def test_the_guard_counts_steps_in_a_row_once_each():
    guard = NonFiniteLossGuard(grace=2, checkpoints_dir="missing")
    guard.observe(first=1, last=1, value=float("nan"))
    guard.observe(first=1, last=1, value=float("nan"))  # a second micro-batch of step 1
    guard.observe(first=2, last=2, value=1.0)  # finite micro-batch: the step is still bad if another was
    guard.observe(first=2, last=2, value=float("inf"))
    assert guard.streak == 2
    guard.observe(first=4, last=4, value=float("nan"))  # step 3 was finite: a new run of bad steps
    assert guard.streak == 1
    with pytest.raises(NonFiniteLoss, match="steps 5-6"):
        guard.observe(first=5, last=6, value=float("nan"))


def test_the_neuron_engine_stops_at_the_first_log_event_carrying_a_nan_loss():
    guard = NonFiniteLossGuard(grace=0, checkpoints_dir="missing")
    callback = StopAtNonFiniteLoss(guard, read_logs=True)
    args, state, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    state.global_step = 10
    callback.on_log(args, state, control, logs={"loss": 2.5})
    state.global_step = 20
    with pytest.raises(NonFiniteLoss, match="the loss is nan at steps 11-20"):
        callback.on_log(args, state, control, logs={"loss": float("nan")})
