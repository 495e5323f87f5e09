"""Torch backend: transformers + trl SFTTrainer + peft (+ bitsandbytes, liger-kernel), on CPU, CUDA or
Trainium2's native ``neuron`` device (the device torch's accelerator API reports, training/device.py).

One process per device under torchrun; `parallel.strategy` picks FSDP2 or DDP (parallel.py),
`train.method` the model and adapter (methods.py); `train.compile`, `train.liger_kernel` and
`train.attention` are the speed levers; `train.profile` traces a window of steps (profiling).
The transformers Trainer resumes exactly (weights, optimizer, scheduler, RNG, data position) from
the checkpoint the plan names (accelerate 1.15's skip_first_batches keeps the epoch of a resume inside
a later epoch itself; tests/payloads/test_train_torch.py resumes inside epoch 2); under FSDP2 those are
sharded distributed checkpoints, and adapter
methods also get a plain peft adapter in each checkpoint so consolidate and generate read it as
they read a one-process checkpoint.

Each train.objective is one of trl's trainers (TRL_TRAINERS) with its arguments from training/plan.py. GRPO's
completions come from the project's vLLM rollout server through trl's ``rollout_func`` hook (training/rollouts.py),
scored by grpo.rewards (training/rewards.py): trl's own server mode syncs weights over NCCL, which neither a CPU host
nor the vLLM site (no trl) has, so the policy reaches the server as what the run trains, a LoRA adapter (export_adapter
under FSDP2, peft's save_pretrained in one process), loaded in place at runtime. The server runs beside the trainer
(colocated) or on the allocation's last node (grpo.rollout; rollout_server.py).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from llm_pipeline import refusals
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import is_chat
from llm_pipeline.run_files import CHECKPOINT, TrainableLine
from llm_pipeline.training import device, parts
from llm_pipeline.training.loss_guard import NonFiniteLossGuard
from llm_pipeline.training.parts import ModelPart, TrainParts
from llm_pipeline.training.plan import (
    TrainPlan,
    completion_only,
    grpo_arguments,
    loss_records,
    preference_arguments,
    reference_line,
    say,
    sft_arguments,
    world_size,
)
from llm_pipeline.training.rewards import reward_functions
from llm_pipeline.training.rollouts import ServerRollouts
from llm_pipeline.training.text_blocks import formatting_func
from llm_pipeline.training.torch import methods, parallel
from llm_pipeline.training.torch.watch import watch_run

TRL_TRAINERS = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "grpo": "GRPOTrainer"}  # train.objective: trl's trainer


def engine_trainer_class(objective: str = "sft"):
    """trl's trainer for ``objective`` (train.objective) plus the glue this engine needs: FSDP2 on CPU, exact
    sharded resume, adapter export, the loss guard."""
    import trl

    class EngineTrainer(getattr(trl, TRL_TRAINERS[objective])):
        def __init__(self, *args, fsdp: bool, model_part: ModelPart, **kwargs):
            self._fsdp = fsdp
            self._model_part = model_part
            super().__init__(*args, **kwargs)
            # after trl wrapped the model, before accelerate shards it and the optimizer reads it
            self.parameter_dtypes = methods.apply_precision(self.model, model_part)

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            if self._fsdp:
                parallel.enable_fsdp_on_cpu(self)
                parallel.apply_mixed_precision_policy(self, self._model_part)

        def _load_optimizer_and_scheduler(self, checkpoint):
            if checkpoint is None or not self.is_fsdp_enabled:
                super()._load_optimizer_and_scheduler(checkpoint)
            else:
                # Not accelerate's FSDP optimizer loader: it reads nothing useful (parallel.py) and opens
                # every rank's file, which a training job's other hosts hold; the scheduler as the Trainer loads it.
                import torch
                from transformers.trainer import SCHEDULER_NAME

                parallel.load_sharded_optimizer(self, Path(checkpoint))
                self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / SCHEDULER_NAME, weights_only=True))
            if checkpoint is not None:
                follow_schedule(self.lr_scheduler)

        def training_step(self, model, inputs, num_items_in_batch=None):
            if self.state.global_step >= self.state.max_steps:  # never past the run's end (run_state)
                raise StepError(f"step {self.state.global_step + 1} would train past max_steps {self.state.max_steps}")
            loss = super().training_step(model, inputs, num_items_in_batch)
            value = loss.detach().float()
            self.step_losses = value if self.step_losses is None else self.step_losses + value
            return loss

        def _get_grad_norm(self, model, grad_norm=None):
            # Right before the optimizer: the step's loss and gradient norm decide whether its update happens.
            grad_norm = super()._get_grad_norm(model, grad_norm)
            step = self.state.global_step + 1
            losses, self.step_losses = self.step_losses, None
            if losses is not None:
                self.loss_guard.observe(first=step, last=step, value=agreed_sum(losses))
            if grad_norm is not None:
                value = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
                self.loss_guard.observe(first=step, last=step, value=float(value), what="gradient norm")
            skip_update(self, model, skip=self.loss_guard.is_bad(step))
            return grad_norm

        def _maybe_log_save_evaluate(self, tr_loss, *args, **kwargs):
            logs = self.control.should_log and self.state.global_step > self._globalstep_last_logged
            super()._maybe_log_save_evaluate(tr_loss, *args, **kwargs)
            if logs:  # the Trainer resets the running loss by subtracting it from itself, which keeps a NaN
                tr_loss.zero_()

        def _save_checkpoint(self, model, trial):
            # Under FSDP the Trainer writes only the sharded state; write the gathered adapter first,
            # so a checkpoint counts as complete (trainer_state.json, written last) only with it.
            if self.is_fsdp_enabled and self.peft_config_for_export is not None:
                folder = Path(self._get_output_dir(trial=trial)) / CHECKPOINT.name(self.state.global_step)
                export_adapter(self, folder)
            super()._save_checkpoint(model, trial)

        peft_config_for_export = None
        loss_guard: NonFiniteLossGuard
        step_losses = None  # this optimizer step's micro-batch losses, summed on the device

    return EngineTrainer


def follow_schedule(scheduler) -> None:
    """Give the optimizer this run's learning rate for the step it resumes at. The restored optimizer state
    holds the lr the checkpointed run's schedule set last (0 at the end of a finished run's decay); this
    run's schedule (a longer max_steps) would replace it only after the first resumed step, which would
    train at that stale lr. transformers' schedules are LambdaLR: lr = base lr x the step's factor."""
    from torch.optim.lr_scheduler import LambdaLR

    if not isinstance(scheduler, LambdaLR):  # reduce_lr_on_plateau: its lr is the state itself
        return
    rates = [
        base * factor(scheduler.last_epoch)
        for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates  # what the Trainer logs before the first resumed step's scheduler.step()


def agreed_sum(losses) -> float:
    """This step's loss summed over the ranks: non-finite on every rank when it is on any, so all ranks skip
    or stop at the same step. One scalar all-reduce and one host sync per optimizer step."""
    import torch.distributed as dist

    total = losses.clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total)
    return total.item()


def skip_update(trainer, model, *, skip: bool) -> None:
    """Leave this step's update out when ``skip``: without gradients torch's optimizers change neither a weight
    nor its state (Adam's moments and step count), and accelerate's skipped-step flag, which the Trainer reads
    to leave the learning-rate schedule where it is (its path for a mixed-precision overflow), is set for
    exactly this step."""
    if skip:
        model.zero_grad(set_to_none=True)
    trainer.optimizer._is_overflow = skip


def export_adapter(trainer, folder: Path) -> None:
    """Gather the adapter weights from every rank; rank 0 saves them as a plain peft adapter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = trainer.model
    trainable = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    )
    if trainer.args.should_save:
        # peft picks the adapter's tensors out of the (full, named) state dict and renames them itself
        model.save_pretrained(str(folder), state_dict=trainable)


def save_adapter(trainer, folder: Path) -> None:
    """The adapter as a plain peft folder: gathered from every rank under FSDP2 (rank 0 writes), else saved."""
    if trainer.is_fsdp_enabled:
        export_adapter(trainer, folder)
    elif trainer.args.should_save:
        trainer.model.save_pretrained(str(folder))


def check_lever_packages(cfg: RunConfig, *, kind: str | None = None) -> None:
    """Stop before any work when the device (``kind``: torch's accelerator) cannot run a chosen lever
    (device.refused_levers: the native Neuron device's, CUDA-only kernels elsewhere) or the lever's package
    (refusals.REFUSALS) is missing from this runtime."""
    refused = device.refused_levers(cfg, device.accelerator_type() if kind is None else kind)
    if refused:
        raise StepError(refused[0])
    for entry in refusals.REFUSALS:
        if entry.package and entry.applies(cfg) and importlib.util.find_spec(entry.package[0]) is None:
            raise StepError(
                f"{entry.key} = {entry.value!r} needs {entry.package[1]}, which this runtime lacks (the CUDA "
                f"training image has it, payloads/requirements-gpu.txt); change {entry.key} or run in that image"
            )


def load_for_rank(cfg: RunConfig, processes: int):
    """This rank's model: the weights, or (full fine-tuning under FSDP, not rank 0) an empty one."""
    empty = parallel.builds_empty(cfg, processes, int(os.environ.get("RANK", "0")))
    return methods.load_model(parts.model_part(cfg), empty=empty)


def build_trainer(cfg: RunConfig, run_parts: TrainParts, plan: TrainPlan, datasets, tokenizer, *, rollout_func=None):
    """The configured trainer and the token counter around its collator (the benchmark times it too).
    ``run_parts``: the model's and the callbacks' records (parts.read). ``rollout_func``: GRPO's completions
    from elsewhere than the rollout server (the parity test replays some)."""
    from transformers import set_seed
    from trl import SFTConfig

    model_part, watch = run_parts.model, run_parts.watch
    trainer_class = engine_trainer_class(cfg.train.objective)
    # Each helper module once, in turn: the device's refusals and arguments, then the layout's.
    kind = device.accelerator_type()
    check_lever_packages(cfg, kind=kind)
    device_arguments = {**device.trainer_device_arguments(kind), **device.shape_arguments(cfg.data.max_length, kind)}
    processes = world_size()
    parallel.check_accelerate_keeps_4bit(cfg, processes)
    fsdp = parallel.uses_fsdp(cfg, processes)
    parallel_arguments = parallel.trainer_arguments(cfg, processes)
    empty = parallel.builds_empty(cfg, processes, int(os.environ.get("RANK", "0")))
    validation = datasets.get("validation")
    evaluation = {"eval_strategy": "steps", "eval_steps": cfg.train.save_steps} if validation is not None else {}
    levers = {"torch_compile": cfg.train.compile}
    chat = is_chat(datasets["train"].column_names)
    loss = {
        "completion_only_loss": completion_only(cfg),
        # chat records: trl labels every token outside the template's {% generation %} turns -100
        "assistant_only_loss": chat and completion_only(cfg),
        "optim": cfg.train.optimizer,
    }
    shared = sft_arguments(cfg, plan)  # the trl arguments every objective shares, read once
    if cfg.train.objective == "sft":
        args = SFTConfig(
            **shared,
            **evaluation,
            **parallel_arguments,
            **device_arguments,
            **levers,
            **loss,
        )
        inputs = {
            "train_dataset": loss_records(cfg, datasets["train"]),
            "eval_dataset": loss_records(cfg, validation),
            "formatting_func": None if completion_only(cfg) or chat else formatting_func(cfg),
        }
    elif cfg.train.objective == "dpo":
        from trl import DPOConfig

        args = DPOConfig(
            **preference_arguments(cfg, shared),
            **evaluation,
            **parallel_arguments,
            **device_arguments,
            **levers,
            optim=cfg.train.optimizer,
        )
        # pairs as prepared; trl disables the adapter or loads the copy for its reference
        inputs = {"train_dataset": datasets["train"], "eval_dataset": validation}
    else:  # grpo
        from trl import GRPOConfig

        args = GRPOConfig(
            **grpo_arguments(cfg, shared),
            **parallel_arguments,
            **device_arguments,
            **levers,
            optim=cfg.train.optimizer,
        )
        # no evaluation split: its completions would be sampled too; the completions come from the rollout server
        # unless ``rollout_func`` is given
        inputs = {
            "train_dataset": datasets["train"],
            "reward_funcs": reward_functions(cfg.grpo),
            "rollout_func": rollout_func or ServerRollouts(cfg, save_adapter),
        }
    # trl creates the adapter before the Trainer seeds anything: seed first, so every rank (FSDP2 shards
    # each rank's own copy, it does not broadcast) and every run starts from the same LoRA A.
    set_seed(cfg.train.seed)
    # what the method says of this run, asked together: its kernels, its compute dtype, then its model
    attention, liger = methods.attention_kernel(model_part), methods.liger_enabled(model_part)
    compute = "bf16" if methods.computes_in_bf16(model_part) else "fp32"
    model, peft_config, expected = methods.method_model(model_part, empty=empty)
    trainer = trainer_class(
        model=model,
        args=args,
        **inputs,
        processing_class=tokenizer,
        peft_config=peft_config,
        fsdp=fsdp,
        model_part=model_part,
    )
    trainer.peft_config_for_export = peft_config
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if trainable != expected:
        raise StepError(
            f"{trainable:,} trainable parameters, but train.method {model_part.method} should give {expected:,}: "
            "the adapter is not applied as configured; check the peft version against "
            "payloads/requirements-cluster.txt"
        )
    dtypes = ", ".join(f"{name} {count:,}" for name, count in sorted(trainer.parameter_dtypes.items()))
    say(
        TrainableLine(model_part.method, f"{trainable:,}", "").format() + "; "
        f"{processes} process(es), {'FSDP2' if fsdp else 'DDP' if processes > 1 else 'one process'}; "
        f"attention {attention}, compile {cfg.train.compile}, liger {liger}, "
        f"gradient checkpointing {cfg.train.gradient_checkpointing}; "
        f"{'chat-format records, ' if chat else ''}"
        + (
            reference_line(cfg)
            if cfg.train.objective == "dpo"
            else f"loss on {'the answers only' if completion_only(cfg) else 'every token'}"
        )
    )
    say(f"precision: trainable parameters fp32, compute {compute}, loss and gradient reduction fp32 ({dtypes})")
    tokens = watch_run(trainer, plan, watch, model.config, grpo=cfg.train.objective == "grpo", trainable=trainable)
    return trainer, tokens


def run(cfg: RunConfig, run_parts: TrainParts, plan: TrainPlan, datasets, tokenizer) -> None:
    trainer, _ = build_trainer(cfg, run_parts, plan, datasets, tokenizer)
    trainer.train(resume_from_checkpoint=str(plan.resume_from) if plan.resume_from else None)
    leave_process_group()


def leave_process_group() -> None:
    """Tear the process group down once every rank has finished, so no rank leaves while another still
    talks to it. FSDP2 keeps a gloo group's worker threads alive even so: the train step then ends
    through cli.exit_step, which skips the interpreter finalization those threads can abort."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
