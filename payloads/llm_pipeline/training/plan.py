"""What both training backends share: the plan, the LoRA config, the trainer arguments, the checks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_pipeline import config
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import is_chat, prompt_completion

ADAPTER_METHODS = ("lora", "dora", "qlora")  # train.method values that train an adapter


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """What this invocation does: a real run (maybe resumed) or a short precompile run."""

    backend: str
    max_steps: int  # -1: train.epochs decides
    logging_steps: int
    save_checkpoints: bool
    resume_from: Path | None  # newest complete checkpoint, when restarting
    start_step: int
    tensorboard_dir: Path | None  # None: precompile metrics would be noise
    stop_after_step: int = 0  # train.stop_after_step: end here with a checkpoint, the schedule unchanged; 0: off
    trained_from: str | None = None  # run_files.TrainedFrom as JSON: what each checkpoint saved records; None: nothing


def world_size(env: Mapping[str, str] | None = None) -> int:
    """Processes in this launch (torchrun's WORLD_SIZE; one per NeuronCore on Trainium)."""
    return int((os.environ if env is None else env).get("WORLD_SIZE", "1"))


def say(message: str) -> None:
    """Print once per launch (global rank 0), not once per process."""
    if os.environ.get("RANK", "0") == "0":
        print(message, flush=True)


def peft_lora_config(lora: config.LoraConfig):
    """The peft LoraConfig for the run's [lora] section (same for both backends)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        use_rslora=lora.use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )


def adapter_config(method: str, lora: config.LoraConfig):
    """The peft config of train.method's adapter (dora: the weight-decomposed LoRA; qlora: LoRA on the 4-bit
    base); None for full fine-tuning, which trains every parameter."""
    if method not in ADAPTER_METHODS:
        return None
    peft_config = peft_lora_config(lora)
    peft_config.use_dora = method == "dora"
    return peft_config


def scheduler_kwargs(train: config.TrainConfig) -> dict[str, float]:
    """transformers' cosine_with_min_lr needs its floor (min_lr); the other schedulers take none."""
    return {"min_lr": train.min_learning_rate} if train.lr_scheduler == "cosine_with_min_lr" else {}


def completion_only(cfg: config.RunConfig) -> bool:
    """data.completion_only_loss, where there are prompts (block mode trains on the whole text)."""
    return cfg.data.completion_only_loss and not cfg.data.blocks


def loss_records(cfg: config.RunConfig, dataset):
    """What trl (both lines) trains on: prompt-completion pairs (trl labels the prompt -100) or the prepared records
    (chat-format records as they are: trl applies the chat template and masks by assistant turn)."""
    if dataset is None or not completion_only(cfg) or is_chat(dataset.column_names):
        return dataset
    return dataset.map(prompt_completion, remove_columns=dataset.column_names, desc="prompt-completion pairs")


def sft_arguments(cfg: config.RunConfig, plan: TrainPlan) -> dict[str, Any]:
    """Keyword arguments common to trl's SFTConfig and optimum-neuron's NeuronSFTConfig."""
    train = cfg.train
    return {
        "output_dir": str(cfg.paths.checkpoints_dir),
        "per_device_train_batch_size": train.per_device_batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "num_train_epochs": train.epochs,
        "max_steps": plan.max_steps,
        "learning_rate": train.learning_rate,
        "lr_scheduler_type": train.lr_scheduler,
        "warmup_steps": train.warmup_steps,
        "weight_decay": train.weight_decay,
        "adam_beta1": train.adam_beta1,
        "adam_beta2": train.adam_beta2,
        "lr_scheduler_kwargs": scheduler_kwargs(train),
        "bf16": train.bf16,
        "seed": train.seed,
        "logging_steps": plan.logging_steps,
        # a NaN or Inf loss shows as such (the filter logs the running average instead: 0.0 from step 1);
        # the engines stop on it (loss_guard.py)
        "logging_nan_inf_filter": False,
        "save_strategy": "steps" if plan.save_checkpoints else "no",
        "save_steps": train.save_steps,
        "save_total_limit": None,  # SealCheckpoints prunes to train.save_total_limit once the new one is sealed
        "report_to": "none",  # our MetricsLogger writes TensorBoard itself, on the logging rank only
        "disable_tqdm": True,
        "max_length": cfg.data.max_length,
        "packing": cfg.data.packing,
    }


def preference_arguments(cfg: config.RunConfig, shared: dict[str, Any]) -> dict[str, Any]:
    """trl's DPOConfig keywords: the ``shared`` ones (sft_arguments; no packing: each pair is padded on its own) and
    the [dpo] section. Dropout stays off (trl's default): the policy's and the reference's log-probabilities must
    be comparable."""
    dpo = cfg.dpo
    return {
        **{key: value for key, value in shared.items() if key != "packing"},
        "beta": dpo.beta,
        "loss_type": [dpo.loss_type],
        "label_smoothing": dpo.label_smoothing,
        "precompute_ref_log_probs": dpo.reference == "precomputed",
        "disable_dropout": True,
    }


# GRPOConfig keys named as trl names them, from [grpo]
GRPO_KEYS = ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "loss_type")
SFT_ONLY = ("max_length", "packing")  # the shared trainer arguments GRPOConfig does not take


def grpo_arguments(cfg: config.RunConfig, shared: dict[str, Any]) -> dict[str, Any]:
    """trl's GRPOConfig keywords: the ``shared`` ones (sft_arguments) that apply, and the [grpo] section's."""
    return {
        **{key: value for key, value in shared.items() if key not in SFT_ONLY},
        **{key: getattr(cfg.grpo, key) for key in GRPO_KEYS},
        "scale_rewards": cfg.grpo.scale_rewards,
        "log_completions": False,
    }


def reference_line(cfg: config.RunConfig) -> str:
    """What DPO's reference model is and costs (the train step and the dry run say it)."""
    dpo = cfg.dpo
    if dpo.reference == "precomputed":
        held = "log-probabilities computed once before training, no reference model held"
    elif cfg.train.method == "full":
        held = "a frozen copy of the base model (its weights' memory again on every process)"
    else:
        held = "the policy with its adapter disabled (no second copy)"
    return f"DPO loss {dpo.loss_type}, beta {dpo.beta}, on the answers; reference: {held}"


def check_target_modules(model, lora: config.LoraConfig) -> None:
    """Every LoRA target must name a module of the model (peft's own error is easy to miss)."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in lora.target_modules if name not in present]
    if missing:
        raise StepError(f"lora.target_modules: {', '.join(missing)} not found in the model ({type(model).__name__})")


def check_trainable(actual: int, expected: int, lora: config.LoraConfig) -> None:
    """Stop when the trainable count is not the LoRA count (optimum-neuron issue #821)."""
    if actual != expected:
        raise StepError(
            f"{actual:,} trainable parameters, but LoRA r={lora.r} on {', '.join(lora.target_modules)} should give "
            f"{expected:,}: the adapter is not applied as configured (optimum-neuron issue #821 trained the full "
            "model when peft was too old); check the peft version against payloads/requirements-cluster.txt"
        )
    say(f"trainable parameters: {actual:,} (the expected LoRA count)")
