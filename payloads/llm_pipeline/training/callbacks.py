"""Trainer callbacks shared by both backends: progress lines on stdout and TensorBoard scalars.

Throughput is measured between two log events: samples = optimizer steps x batch x GA x data-parallel
replicas; tokens are the real (non-padding) tokens the data collator handed out on this rank, times
the replicas. The blog's "samples/s" is per replica, so that is logged too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from transformers import TrainerCallback

from llm_pipeline.jobs import prom_textfile
from llm_pipeline.run_files import CHECKPOINT, TRAINED_FROM_FILE, EventLine, ProgressLine, ReplicasLine
from llm_pipeline.weights.checkpoints import prune, write_seal


def row_lengths(feature: dict) -> list[int]:
    """The batch rows one record becomes: one (SFT), or a preference pair's prompt + chosen and prompt + rejected."""
    if "input_ids" in feature:
        return [len(feature["input_ids"])]
    return [len(feature["prompt_ids"]) + len(feature[name]) for name in ("chosen_ids", "rejected_ids")]


class TokenCounter:
    """Wraps a data collator and counts the real tokens of the batches it builds, and all positions.

    Real tokens are measured on the examples before the collator sees them (their length, capped at
    the batch width), so padding never counts, whatever the collator does to its input or mask.
    ``context`` sums every real token's attended span, its example's length (a packed row lists its
    examples' lengths in trl's ``seq_lengths``), for the attention term of MFU.
    """

    def __init__(self, collator):
        self.collator = collator
        self.real = 0
        self.total = 0
        self.context = 0

    def __call__(self, features):
        rows = [(length, f.get("seq_lengths") or [length]) for f in features for length in row_lengths(f)]
        lengths, examples = [length for length, _ in rows], [row for _, row in rows]
        batch = self.collator(features)
        ids = batch["input_ids"]
        width = ids.shape[-1]
        self.total += ids.numel()
        self.real += sum(min(length, width) for length in lengths)
        self.context += sum(min(length, width) ** 2 for row in examples for length in row)
        return batch


# Optional fields of a log event, as the progress line prints them: key, label, scale, digits, unit. Other callbacks
# add mfu and peak memory (training/torch/watch.py); trl's GRPOTrainer logs the reward (and its std), KL and
# completion length.
EXTRA_FIELDS = (
    ("mfu", "mfu", 100, 1, "%"),
    ("peak_memory_gb", "peak mem", 1, 2, " GB"),
    ("reward", "reward", 1, 4, ""),
    ("reward_std", "reward std", 1, 4, ""),  # over the step's completions: the spread the advantages come from
    ("kl", "kl", 1, 4, ""),
    ("completions/mean_length", "completion len", 1, 1, ""),
)


def _scalar_name(key: str) -> str:
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_") :]
    if key.startswith("train_"):
        return "summary/" + key[len("train_") :]
    return "train/" + key


class MetricsLogger(TrainerCallback):
    """Prints one progress line per log event and writes the same numbers to TensorBoard."""

    def __init__(
        self, *, tokens: TokenCounter, trainable: int, tensorboard_dir: Path | None, sequence_length: int | None = None
    ):
        self.tokens = tokens
        self.trainable = trainable
        self.sequence_length = sequence_length
        self.tensorboard_dir = tensorboard_dir
        self.writer = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_time, self.last_step, self.last_tokens = time.perf_counter(), state.global_step, self.tokens.real
        if not state.is_world_process_zero:
            return
        if self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.tensorboard_dir))
            self.writer.add_scalar("model/trainable_parameters", self.trainable, state.global_step)
            if self.sequence_length is not None:  # the engines give it: events then carry a tokens-seen axis
                sequences = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
                self.writer.add_scalar("model/sequences_per_step", sequences, state.global_step)
                self.writer.add_scalar("model/sequence_length", self.sequence_length, state.global_step)
        print(ReplicasLine(state.global_step, state.max_steps, args.world_size).format(), flush=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        metrics = {key: float(value) for key, value in logs.items() if isinstance(value, (int, float))}
        now, steps = time.perf_counter(), state.global_step - self.last_step
        if steps > 0 and "loss" in metrics:
            elapsed = max(now - self.last_time, 1e-9)
            replicas = args.world_size
            samples = steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * replicas
            metrics["samples_per_second"] = samples / elapsed
            metrics["samples_per_second_per_replica"] = samples / elapsed / replicas
            metrics["tokens_per_second"] = (self.tokens.real - self.last_tokens) * replicas / elapsed
            eta = timedelta(seconds=round(elapsed / steps * (state.max_steps - state.global_step)))
            self.last_time, self.last_step, self.last_tokens = now, state.global_step, self.tokens.real
            extra = tuple(
                f"{label} {metrics[key] * scale:.{digits}f}{unit}"
                for key, label, scale, digits, unit in EXTRA_FIELDS
                if key in metrics
            )
            line = ProgressLine(
                step=state.global_step,
                total=state.max_steps,
                loss=metrics["loss"],
                learning_rate=metrics.get("learning_rate", 0.0),
                samples_per_second=metrics["samples_per_second"],
                tokens_per_second=metrics["tokens_per_second"],
                eta=str(eta),
                extra=extra,
            )
            print(line.format(), flush=True)
            prom_textfile.publish_event(  # for node exporter, where the node has observability on
                metrics,
                step=state.global_step,
                max_steps=state.max_steps,
                eta_seconds=eta.total_seconds(),
                run=Path(args.output_dir).parent.name,
            )
        else:
            print(EventLine(state.global_step, state.max_steps, tuple(metrics.items())).format(), flush=True)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(_scalar_name(key), value, state.global_step)
            self.writer.flush()

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            print(f"checkpoint saved: {Path(args.output_dir) / CHECKPOINT.name(state.global_step)}", flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class SealCheckpoints(TrainerCallback):
    """After every save, once every process has written its part: each node's first process seals
    that node's part of the checkpoint (weights/checkpoints.py); once every node has sealed, it
    deletes its node's checkpoints beyond the newest ``keep`` sealed ones (train.save_total_limit).
    Pruning waits for the other nodes' seals: on a shared file system the new checkpoint is complete
    only with all of them, and with keep 1 a crash between one node's pruning and another's seal left
    nothing to resume from. The trainers get no save_total_limit (plan.sft_arguments): transformers
    deletes inside its save, before on_save, and only where global rank 0 runs, while on a training
    job every host has its own disk."""

    trained_from: str | None = None  # the run's record (TrainPlan.trained_from), written into each checkpoint

    def __init__(self, *, wait_for_everyone: Callable[[], None], keep: int):
        self.wait_for_everyone = wait_for_everyone
        self.keep = keep

    def on_save(self, args, state, control, **kwargs):
        first_on_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
        node = int(os.environ.get("GROUP_RANK", "0"))
        folder = Path(args.output_dir) / CHECKPOINT.name(state.global_step)
        if self.trained_from is not None and int(os.environ.get("RANK", "0")) == 0:
            # one writer, as of the trainer's shared files, and whole before any node seals (its seal lists it)
            (folder / TRAINED_FROM_FILE).write_text(self.trained_from)
        self.wait_for_everyone()
        if first_on_node:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
            write_seal(folder, node=node, nodes=nodes)
        self.wait_for_everyone()
        if first_on_node:
            prune(Path(args.output_dir), keep=self.keep, node=node)


class StopAfterStep(TrainerCallback):
    """train.stop_after_step: end training after ``step`` and save a checkpoint there, leaving max_steps, and so
    the learning-rate schedule, that of the whole run. (Cutting max_steps instead would decay the schedule to
    its end by that step, and a run resumed from the checkpoint would restore that spent schedule.) The
    transformers Trainer and optimum-neuron's NeuronTrainer both read these flags right after on_step_end:
    save, then leave the loop."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
            control.should_save = args.save_strategy != "no"


def add_run_callbacks(
    trainer, plan, *, tokens: TokenCounter, trainable: int, sequence_length: int, seal: SealCheckpoints
) -> None:
    """The callbacks every engine adds after its own, in this order: the progress line and TensorBoard
    scalars, the checkpoint seals (``seal``: with the engine's own barrier), and train.stop_after_step."""
    trainer.add_callback(
        MetricsLogger(
            tokens=tokens, trainable=trainable, sequence_length=sequence_length, tensorboard_dir=plan.tensorboard_dir
        )
    )
    seal.trained_from = plan.trained_from
    trainer.add_callback(seal)
    if plan.stop_after_step:
        trainer.add_callback(StopAfterStep(plan.stop_after_step))
