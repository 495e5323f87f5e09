"""What watches a run on the torch engine: its callbacks, added in their order (watch_run), and the one that is its
own, UtilisationMetrics (non-padding tokens/s, MFU and peak memory on each log event, by training/metrics.py's
accounting). The others are both engines' (training/callbacks.py, training/loss_guard.py) or the profiler's
(profiling.py); each reads the run's watch record (training/parts.WatchPart), never the config."""

from __future__ import annotations

from transformers import TrainerCallback

from llm_pipeline.training.callbacks import SealCheckpoints, TokenCounter, add_run_callbacks
from llm_pipeline.training.loss_guard import NonFiniteLossGuard, StopAtNonFiniteLoss
from llm_pipeline.training.metrics import device_peak_flops, flops_per_token, mfu, peak_memory_bytes
from llm_pipeline.training.parts import WatchPart
from llm_pipeline.training.plan import TrainPlan
from llm_pipeline.training.torch.profiling import StepProfiler


def watch_run(trainer, plan: TrainPlan, watch: WatchPart, model_config, *, grpo: bool, trainable: int) -> TokenCounter:
    """The callbacks that watch the run, in their order: the printer out, the utilisation metrics, the shared
    ones (add_run_callbacks), the non-finite loss stop, then the profiler. Returns the token counter."""
    from transformers import PrinterCallback

    tokens = TokenCounter(trainer.data_collator)
    if grpo:  # its batches are records: the rollouts count the tokens
        trainer.rollout_func.tokens = tokens
    else:
        trainer.data_collator = tokens
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(
        UtilisationMetrics(tokens=tokens, model_config=model_config, full=watch.full, peak_flops=device_peak_flops())
    )
    add_run_callbacks(
        trainer,
        plan,
        tokens=tokens,
        trainable=trainable,
        sequence_length=watch.sequence_length,
        seal=SealCheckpoints(wait_for_everyone=trainer.accelerator.wait_for_everyone, keep=watch.save_total_limit),
    )
    trainer.loss_guard = NonFiniteLossGuard(
        grace=watch.nonfinite_loss_grace,
        checkpoints_dir=watch.checkpoints_dir,
        last_step=plan.stop_after_step or None,  # else the run's max_steps, once training begins
    )
    trainer.add_callback(StopAtNonFiniteLoss(trainer.loss_guard, read_logs=False))
    if watch.profile_window is not None and plan.save_checkpoints:
        trainer.add_callback(StepProfiler(window=watch.profile_window, folder=watch.profile_dir))
    return tokens


class UtilisationMetrics(TrainerCallback):
    """Adds non-padding tokens/s, MFU and peak memory to each log event (before MetricsLogger prints it)."""

    def __init__(self, *, tokens, model_config, full: bool, peak_flops: float | None):
        self.tokens = tokens  # the TokenCounter around the data collator
        self.model_config = model_config
        self.full = full
        self.peak_flops = peak_flops

    def on_train_begin(self, args, state, control, **kwargs):
        import time

        self._clock = time.perf_counter
        self.last_time, self.last_tokens, self.last_context = self._clock(), self.tokens.real, self.tokens.context

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        now = self._clock()
        elapsed = max(now - self.last_time, 1e-9)
        tokens = self.tokens.real - self.last_tokens
        context = self.tokens.context - self.last_context
        tokens_per_second = tokens * args.world_size / elapsed
        self.last_time, self.last_tokens, self.last_context = now, self.tokens.real, self.tokens.context
        logs["peak_memory_gb"] = peak_memory_bytes() / 1e9
        if self.peak_flops and tokens:
            flops_token = flops_per_token(self.model_config, context / tokens, full=self.full)
            logs["mfu"] = mfu(tokens_per_second, flops_token, args.world_size, self.peak_flops)
