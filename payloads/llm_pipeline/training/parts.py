"""What the training parts read from the run config: the train step reads the loaded RunConfig once
(train.read_run) into these records, the plan (make_plan: TrainPlan) and the run state's record (run_state.RunEnd),
and hands each part its own: the model loading and the callbacks see the keys they need, never the whole config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_pipeline import config
from llm_pipeline.training.plan import TrainPlan
from llm_pipeline.weights.checkpoints import checkpoint_step, newest_complete

FROM_BASE_MODEL = "none"  # --resume-from: no checkpoint


@dataclass(frozen=True, kw_only=True)
class ModelPart:
    """How the base model loads and which adapter wraps it (torch/methods.py): train.method, the precision and
    kernel levers, and the [lora] section."""

    model_dir: str
    method: str
    bf16: bool
    attention: str
    liger_kernel: bool | str
    lora: config.LoraConfig


@dataclass(frozen=True, kw_only=True)
class WatchPart:
    """What watches a run from its callbacks: the non-finite loss guard, the checkpoint seals, the metrics and
    the profiler (the engines' add_run_callbacks and the torch engine's profiler)."""

    checkpoints_dir: Path
    nonfinite_loss_grace: int
    save_total_limit: int
    sequence_length: int
    full: bool  # train.method full: every parameter counts towards the FLOPs
    profile_window: tuple[int, int] | None
    profile_dir: Path


@dataclass(frozen=True, kw_only=True)
class TrainParts:
    """The parts' records of one run, read at once (read): what the engine hands its model loading and its
    callbacks."""

    model: ModelPart
    watch: WatchPart


def read(cfg: config.RunConfig) -> TrainParts:
    return TrainParts(model=model_part(cfg), watch=watch_part(cfg))


def model_part(cfg: config.RunConfig) -> ModelPart:
    return ModelPart(
        model_dir=cfg.paths.model_dir,
        method=cfg.train.method,
        bf16=cfg.train.bf16,
        attention=cfg.train.attention,
        liger_kernel=cfg.train.liger_kernel,
        lora=cfg.lora,
    )


def watch_part(cfg: config.RunConfig) -> WatchPart:
    return WatchPart(
        checkpoints_dir=cfg.paths.checkpoints_dir,
        nonfinite_loss_grace=cfg.train.nonfinite_loss_grace,
        save_total_limit=cfg.train.save_total_limit,
        sequence_length=cfg.data.max_length,
        full=cfg.train.method == "full",
        profile_window=cfg.train.profile_window,
        profile_dir=cfg.paths.profile_dir,
    )


def make_plan(cfg: config.RunConfig, backend: str, precompile: bool, resume_from: str | None = None) -> TrainPlan:
    """``resume_from``: the checkpoint folder (or FROM_BASE_MODEL) the hosts agreed on; None: the newest
    complete checkpoint in paths.checkpoints_dir."""
    train = cfg.train
    if precompile:
        # Same graphs as the real run, a few steps, one log event (its graph is compiled too), no saving.
        return TrainPlan(
            backend=backend,
            max_steps=train.precompile_steps,
            logging_steps=min(train.logging_steps, train.precompile_steps),
            save_checkpoints=False,
            resume_from=None,
            start_step=0,
            tensorboard_dir=None,
        )
    if resume_from == FROM_BASE_MODEL:
        step, folder = 0, None
    elif resume_from is not None:
        step, folder = checkpoint_step(Path(resume_from)), Path(resume_from)
    else:
        newest = newest_complete(cfg.paths.checkpoints_dir)
        step, folder = newest if newest else (0, None)
    return TrainPlan(
        backend=backend,
        max_steps=train.max_steps,
        logging_steps=train.logging_steps,
        save_checkpoints=train.save_checkpoints,
        resume_from=folder,
        start_step=step,
        tensorboard_dir=cfg.paths.tensorboard_dir,
        stop_after_step=train.stop_after_step,
    )
