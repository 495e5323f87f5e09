"""Keep NaN and Inf steps out of the weights (train.nonfinite_loss_grace), and stop when they persist; both engines.

A non-finite loss poisons the weights at the next optimizer step, and the transformers Trainer hides it:
with ``logging_nan_inf_filter`` on (its default) it replaces such a loss by the running average, so a run that
is NaN from step 1 logs ``loss 0.0000`` and saves checkpoints. The engines turn that filter off
(plan.sft_arguments), so a NaN shows as NaN.

- torch: a step whose loss (any micro-batch, summed over the ranks: every rank sees the same value) or whose
  gradient norm (global) is non-finite is skipped, as torchtitan and Megatron skip a step on an Inf/NaN
  gradient norm: its gradients are dropped before the optimizer runs, so its update never reaches the
  weights or the optimizer state, and the learning-rate schedule waits (torch/backend.py). The step still
  counts (its batch is used up), is logged as NaN, and gets no checkpoint. More such steps in a row than the
  grace, or one at the run's last step (a run never ends on a skipped step), stop training with a StepError
  (``error:`` line, exit 2: the Slurm chain stops there) naming the step and the checkpoint to resume from.
- neuron: the loss of each log event (optimum-neuron averages the micro-batch losses since the last one without
  filtering them); reading every step's loss would force an XLA sync per step, and by then the updates are in
  the weights, so nothing can be skipped: the grace is 0 there (config.check_backend) and the stop comes at the
  first log event after the bad step (train.logging_steps).
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from llm_pipeline.errors import StepError
from llm_pipeline.run_files import NAN_STOP_OPENING, describe_number
from llm_pipeline.training.plan import say
from llm_pipeline.weights.checkpoints import newest_complete


class NonFiniteLoss(StepError):
    """Training stopped: the loss was NaN or Inf for more steps in a row than train.nonfinite_loss_grace, or at
    the run's last step."""


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


class NonFiniteLossGuard:
    """Counts the optimizer steps in a row with a non-finite loss; more than ``grace``, or one at ``last_step``
    (the run's end, set when training begins), stops training.

    ``observe(first, last, value)``: the loss of steps first..last (one step, or a log event's window).
    A step with any non-finite micro-batch counts once; a finite step in between starts the count again.
    ``skipped``: the bad steps of this run that stayed within the grace (their updates skipped).
    """

    def __init__(self, *, grace: int, checkpoints_dir: Path, last_step: int | None = None):
        self.grace = grace
        self.checkpoints_dir = Path(checkpoints_dir)
        self.last_step = last_step
        self.streak = 0
        self.last_bad = -1
        self.skipped = 0

    def observe(self, *, first: int, last: int, value: float, what: str = "loss") -> None:
        if _finite(value):
            return
        if first <= self.last_bad:
            first = self.last_bad + 1  # this step was counted already (an earlier micro-batch)
        if first > last:
            return
        self.streak = self.streak + (last - first + 1) if first == self.last_bad + 1 else last - first + 1
        self.last_bad = last
        where = f"step {last}" if first == last else f"steps {first}-{last}"
        at_end = self.last_step is not None and last >= self.last_step
        if self.streak > self.grace or at_end:
            newest = newest_complete(self.checkpoints_dir)
            resume = (
                f"resubmitting resumes from the newest checkpoint, {newest[1]}, written before it"
                if newest
                else "no checkpoint was saved yet: resubmitting starts from the base model"
            )
            why = (
                "the run's last step: a run does not end on a skipped step"
                if at_end and self.streak <= self.grace
                else f"{self.streak} step(s) in a row"
            )
            raise NonFiniteLoss(
                f"{NAN_STOP_OPENING}{what} is {value} at {where} ({why}; train.nonfinite_loss_grace = "
                f"{self.grace}); {resume}. Check the base model's weights and the data, or lower train.learning_rate"
            )
        self.skipped += last - first + 1
        say(
            f"{where}: the {what} is {describe_number(value)}: its update is skipped ({self.streak} in a row of "
            f"train.nonfinite_loss_grace = {self.grace}; {self.skipped} skipped in this run)"
        )

    def is_bad(self, step: int) -> bool:
        """Whether ``step`` had a non-finite loss (its update and checkpoint are then skipped)."""
        return self.last_bad == step


class StopAtNonFiniteLoss(TrainerCallback):
    """The guard on log events (neuron engine: the loss each log event carries), the run's end as its last
    step, and no checkpoint of a step whose loss the guard saw non-finite (torch engine, within the grace)."""

    def __init__(self, guard: NonFiniteLossGuard, *, read_logs: bool):
        self.guard = guard
        self.read_logs = read_logs
        self.last_logged = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_logged = state.global_step
        if self.guard.last_step is None:
            self.guard.last_step = state.max_steps

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.read_logs or not logs or "loss" not in logs:
            return
        first = (self.last_logged or 0) + 1
        self.last_logged = state.global_step
        self.guard.observe(first=first, last=state.global_step, value=float(logs["loss"]))

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.is_bad(state.global_step):
            control.should_save = False
