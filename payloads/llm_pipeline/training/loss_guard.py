"""Stop training at a NaN or Inf loss (train.nonfinite_loss_grace), both engines.

A non-finite loss poisons the weights at the next optimizer step, and the transformers Trainer hides it:
with ``logging_nan_inf_filter`` on (its default) it replaces such a loss by the running average, so a run that
is NaN from step 1 logs ``loss 0.0000`` and saves checkpoints. The engines turn that filter off
(plan.sft_arguments), so a NaN shows as NaN, and stop with a StepError (``error:`` line, exit 2: the Slurm chain
stops there) naming the step and the newest checkpoint, which was written before the bad step.

- torch: the real loss of every micro-batch (EngineTrainer.training_step), agreed over the ranks so every rank
  stops at the same step (the Trainer's own filter read that value on the host too), and the gradient norm of
  every step before the optimizer applies it (a finite loss can still give an Inf gradient).
- neuron: the loss of each log event (optimum-neuron averages the micro-batch losses since the last one without
  filtering them); reading every step's loss would force an XLA sync per step. The stop comes at the first log
  event after the bad step (train.logging_steps).
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from llm_pipeline.errors import StepError
from llm_pipeline.weights.checkpoints import newest_complete


class NonFiniteLoss(StepError):
    """Training stopped: the loss was NaN or Inf for more steps in a row than train.nonfinite_loss_grace."""


class NonFiniteLossGuard:
    """Counts the optimizer steps in a row with a non-finite loss; more than ``grace`` stops training.

    ``observe(first, last, finite)``: the loss of steps first..last (one step, or a log event's window).
    A step with any non-finite micro-batch counts once; a finite step in between starts the count again.
    """

    def __init__(self, *, grace: int, checkpoints_dir: Path):
        self.grace = grace
        self.checkpoints_dir = Path(checkpoints_dir)
        self.streak = 0
        self.last_bad = -1

    def observe(self, *, first: int, last: int, value: float, what: str = "loss") -> None:
        if value == value and abs(value) != float("inf"):
            return
        if first <= self.last_bad:
            first = self.last_bad + 1  # this step was counted already (an earlier micro-batch)
        if first > last:
            return
        self.streak = self.streak + (last - first + 1) if first == self.last_bad + 1 else last - first + 1
        self.last_bad = last
        if self.streak > self.grace:
            newest = newest_complete(self.checkpoints_dir)
            kept = f"the newest checkpoint is {newest[1]}" if newest else "no checkpoint was saved"
            where = f"step {last}" if first == last else f"steps {first}-{last}"
            raise NonFiniteLoss(
                f"training stopped: the {what} is {value} at {where} ({self.streak} step(s) in a row; "
                f"train.nonfinite_loss_grace = {self.grace}); {kept}, written before it. Check the base model's "
                "weights and the data, or lower train.learning_rate; resubmitting resumes from that checkpoint"
            )

    def is_bad(self, step: int) -> bool:
        """Whether ``step`` had a non-finite loss (its checkpoint is then skipped)."""
        return self.last_bad == step


class StopAtNonFiniteLoss(TrainerCallback):
    """The guard on log events (neuron engine: the loss each log event carries), and no checkpoint of a step
    whose loss the guard saw non-finite (torch engine, within the grace)."""

    def __init__(self, guard: NonFiniteLossGuard, *, read_logs: bool):
        self.guard = guard
        self.read_logs = read_logs
        self.last_logged = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_logged = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.read_logs or not logs or "loss" not in logs:
            return
        first = (self.last_logged or 0) + 1
        self.last_logged = state.global_step
        self.guard.observe(first=first, last=state.global_step, value=float(logs["loss"]))

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.is_bad(state.global_step):
            control.should_save = False
