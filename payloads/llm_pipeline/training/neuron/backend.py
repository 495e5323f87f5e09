"""Neuron backend: optimum-neuron 0.4.x on Trainium (run under torchrun, one process per NeuronCore).

Thin on purpose: data, LoRA config, trainer arguments, callbacks and checks come from plan and
callbacks; only the model class, the trainer and the parallel layout are Neuron's. Every class,
function and keyword used here, and the values we pass, are checked against the installed
optimum-neuron 0.4.5 and trl 0.24.0 sources by tests/payloads/test_neuron_contract.py (this machine
cannot import the trainer). What we change from optimum-neuron's defaults, and why:

- data_collator: a fixed-length collator that masks padding (training/collator.py); the default one
  labels the padding and attends to it.
- completion_only_loss (data.completion_only_loss, the default): dolly records go to the trainer as
  prompt-completion pairs with no formatting function, so trl 0.24's dataset preparation (which
  NeuronSFTTrainer inherits) marks the completion tokens and the collator labels only those; with a
  formatting function the whole text would be labelled, prompt included.
- get_decay_parameter_names: AdamW decays every parameter but norm weights and biases, as the full
  fine-tuning reference (NeMo Megatron) groups them; optimum-neuron 0.4.5 exempts only names containing
  bias/layernorm/rmsnorm, so Llama's final ``model.norm`` and Qwen3's q_norm/k_norm were decayed.
- disable_sequence_parallel: LoRA's replicated factor (lora_A of q/k/v/gate/up, lora_B of o/down)
  is a plain nn.Linear; with sequence parallelism each TP rank would feed it only its slice of the
  sequence and nothing sums its gradient across ranks (only parameters tagged
  sequence_parallel_enabled are), so every rank would train its own copy.
- save_only_model: resume (below) consolidates the weights and never reads optimizer state, so
  checkpoints leave it out (for full fine-tuning that is 12 of every 14 bytes per parameter).
- stochastic_rounding_enabled (optimum-neuron's default, stated): bf16 rounds stochastically
  (NEURON_RT_STOCHASTIC_ROUNDING_EN=1, also exported by payloads/slurm/env.sh).
- optimizer_use_master_weights / optimizer_use_fp32_grad_acc follow train.fp32_master_weights: on
  (optimum-neuron's default) keeps fp32 master weights and fp32 gradient accumulation in ZeRO-1;
  off trains in pure bf16 with stochastic rounding, as AWS's trn1 full fine-tuning reference does.
- skip_cache_push: train() otherwise ends by checking write access to, and pushing to, the Hub's
  compile cache, which raises on network errors after the checkpoints are saved. The Slurm steps
  after download and data also run with HF_HUB_OFFLINE=1 (payloads/slurm/env.sh).
- attn_implementation: the NKI flash-attention kernel when data.max_length allows it, else eager
  (neuron/rules.py attention_kernel: one decision for the precompile run and the real run).

Full fine-tuning (train.method = full): no peft config, every parameter trains; sequence
parallelism stays on (every parameter is then either tensor-parallel or a norm weight tagged
sequence_parallel_enabled, whose gradient optimum-neuron sums over TP); ZeRO-1 shards the AdamW
moments (and the fp32 master weights, when train.fp32_master_weights) over the data-parallel
ranks; train.gradient_checkpointing turns on optimum-neuron's activation recomputation. The
trainable count must be the whole model (as get_model_param_count counts it: TP parameters x TP
size, replicated KV heads included).

Checkpoint seals (training/callbacks.py SealCheckpoints, as on the torch engine): optimum-neuron
0.4.5's NeuronTrainer.maybe_save_checkpoint queues one XLA step closure that every rank runs:
``_save_checkpoint()``, then ``callback_handler.on_save``. ``_save_checkpoint`` ends with
``xm.rendezvous("checkpoint_saved")``, and with ``async_save`` off (its default; we never set it) the
neuronx-distributed 2.26 save underneath writes each file before it returns (trainer/checkpoint.py:
CheckpointIOState.add_save_task saves at once; with async_save it only queues the files for a thread
that finishes at the next save or at exit). So at on_save every rank's files are on disk, and the
seal's own barrier is xm.rendezvous, the one the library calls in that same closure. With async_save
on there is no such point inside the callback, so seal_checkpoints refuses it rather than seal files
that may still be in flight.

Resume: optimum-neuron 0.4.5's NeuronTrainer refuses `resume_from_checkpoint`, so a restart
consolidates the newest sharded adapter, loads it into the LoRA model, and continues the step count
and the learning-rate schedule from that step; the optimizer moments and the data order restart.
A full fine-tuning restart does the same with the whole model: global rank 0 consolidates the
checkpoint once into ``<run>/resume/checkpoint-<step>`` (atomically), every rank loads the model
from there.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import AutoConfig, PrinterCallback, TrainerCallback

from llm_pipeline import model_shapes
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import COLUMNS, is_chat
from llm_pipeline.training import full_rules
from llm_pipeline.training.callbacks import SealCheckpoints, TokenCounter, add_run_callbacks
from llm_pipeline.training.collator import FixedLengthCollator, pad_token_id
from llm_pipeline.training.loss_guard import NonFiniteLossGuard, StopAtNonFiniteLoss
from llm_pipeline.training.neuron.rules import attention_kernel, check_neuron_run, kv_size_multiplier
from llm_pipeline.training.parts import TrainParts
from llm_pipeline.training.plan import (
    TrainPlan,
    adapter_config,
    check_trainable,
    completion_only,
    loss_records,
    say,
    sft_arguments,
    world_size,
)
from llm_pipeline.training.text_blocks import formatting_func

if TYPE_CHECKING:
    from optimum.neuron import NeuronSFTTrainer
    from optimum.neuron.peft import NeuronPeftModel


def check_parallel_layout(cfg: RunConfig, world: int, env: Mapping[str, str] | None = None) -> None:
    """TP x PP must divide the NeuronCores of the launch; the rest is data parallelism.

    When they do not, the usual cause is the launch, not the config: HPL_DEVICES_PER_NODE (the cluster
    facts) unset or different from parallel.devices_per_node starts too few processes per node.
    """
    env = os.environ if env is None else env
    tp, pp = cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size
    if not world % (tp * pp):
        return
    per_node, wanted = env.get("LOCAL_WORLD_SIZE"), cfg.parallel.devices_per_node
    if per_node is not None and int(per_node) != wanted:
        setting = env.get("HPL_DEVICES_PER_NODE")
        how = f"HPL_DEVICES_PER_NODE={setting}" if setting else "HPL_DEVICES_PER_NODE is not set, so 1 per node"
        raise StepError(
            f"this launch started {per_node} process(es) per node ({how}) but parallel.devices_per_node is {wanted}, "
            f"so its {world} processes cannot hold tensor_parallel_size {tp} x pipeline_parallel_size {pp}: set "
            f"HPL_DEVICES_PER_NODE to the NeuronCores of a node ({wanted}; the cluster facts in "
            "/etc/profile.d/hyperpod-lora.sh set it on HyperPod nodes)"
        )
    raise StepError(
        f"parallel.tensor_parallel_size {tp} (x pipeline_parallel_size {pp}) does not divide the {world} "
        "NeuronCores of this launch (WORLD_SIZE): choose a tensor_parallel_size that divides it"
    )


RESUME_WAIT_S = 3600  # consolidating an 8B checkpoint on FSx takes minutes; a stuck rank 0 should not hang forever


def check_full_trainable(actual: int, expected: int) -> None:
    """Full fine-tuning must train every parameter (a frozen layer or a stray adapter would show here)."""
    if actual != expected:
        raise StepError(
            f"{actual:,} trainable parameters, but full fine-tuning of this model should train all {expected:,}: "
            "some parameters are frozen or an adapter was applied; check train.method and the model folder"
        )
    say(f"trainable parameters: {actual:,} (every parameter: full fine-tuning)")


def neuron_arguments(cfg: RunConfig) -> dict[str, Any]:
    """NeuronSFTConfig keywords beyond the shared ones (why each value: see the module docstring)."""
    return {
        "tensor_parallel_size": cfg.parallel.tensor_parallel_size,
        "pipeline_parallel_size": cfg.parallel.pipeline_parallel_size,
        "disable_sequence_parallel": cfg.train.method != "full",
        "skip_cache_push": True,
        "zero_1": True,
        "gradient_checkpointing": cfg.train.gradient_checkpointing,
        "save_only_model": True,
        "stochastic_rounding_enabled": True,
        "optimizer_use_master_weights": cfg.train.fp32_master_weights,
        "optimizer_use_fp32_grad_acc": cfg.train.fp32_master_weights,
        "completion_only_loss": completion_only(cfg),
    }


def sft_inputs(cfg: RunConfig, dataset) -> tuple[Any, Callable[[Any], str] | None]:
    """(train_dataset, formatting_func) for NeuronSFTTrainer: prompt-completion pairs and no formatter (trl marks
    the completion) with completion-only loss, else the records and the per-example formatter."""
    return loss_records(cfg, dataset), None if completion_only(cfg) else formatting_func(cfg)


def decay_parameter_names(model) -> list[str]:
    """Names of the parameters AdamW decays: all but the weights of norm modules and biases (the reference's
    grouping). A norm is an nn.LayerNorm or a class named ...Norm (LlamaRMSNorm, Qwen3RMSNorm)."""
    import torch

    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("Norm"):
            continue
        names += [
            f"{prefix}.{name}" if prefix else name
            for name, _ in module.named_parameters(recurse=False)
            if name != "bias"
        ]
    return names


def model_arguments(cfg: RunConfig) -> dict[str, Any]:
    """NeuronModelForCausalLM.from_pretrained keywords: dtype and attention kernel."""
    import torch

    dtype = torch.bfloat16 if cfg.train.bf16 else torch.float32
    return {"torch_dtype": dtype, "attn_implementation": attention_kernel(cfg)}


def data_collator(cfg: RunConfig, tokenizer) -> FixedLengthCollator:
    """Batches exactly data.max_length wide (one compiled graph), padding masked from attention and loss."""
    return FixedLengthCollator(
        pad_token_id=pad_token_id(tokenizer), max_length=cfg.data.max_length, completion_only_loss=completion_only(cfg)
    )


SEAL_RENDEZVOUS = "hpl_checkpoint_sealed"


def seal_checkpoints(args, rendezvous: Callable[[str], Any], *, keep: int) -> SealCheckpoints:
    """The seal callback for NeuronTrainer, its barrier ``rendezvous`` (torch_xla's xm.rendezvous), pruning to
    ``keep`` checkpoints; refused when the trainer saves asynchronously (see the module docstring)."""
    if getattr(args, "async_save", False):
        raise StepError(
            "async_save is on: optimum-neuron would still be writing a checkpoint's files when it calls on_save, "
            "so its completion seal would be a lie; leave async_save unset (the pipeline never sets it)"
        )
    return SealCheckpoints(wait_for_everyone=lambda: rendezvous(SEAL_RENDEZVOUS), keep=keep)


class ContinueStepCount(TrainerCallback):
    """Start the step counter, the loss average and the LR schedule at the resumed step."""

    def __init__(self, trainer: NeuronSFTTrainer, start_step: int):
        self.trainer = trainer
        self.start_step = start_step

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        state.global_step = self.start_step
        self.trainer.global_step_last_logged = self.start_step
        for _ in range(self.start_step):
            lr_scheduler.step()


def restore_adapter(cfg: RunConfig, model, lora, checkpoint: Path) -> NeuronPeftModel:
    """The LoRA model with the adapter weights of a sharded checkpoint loaded into it."""
    from optimum.neuron.peft import get_peft_model

    from llm_pipeline.consolidate import consolidate_checkpoint
    from llm_pipeline.errors import CheckpointError

    with tempfile.TemporaryDirectory(prefix="resume-") as scratch:
        adapter = Path(scratch) / "adapter"
        try:
            consolidate_checkpoint(checkpoint, adapter, model_dir=Path(cfg.paths.model_dir))
        except CheckpointError as exc:
            raise StepError(f"cannot resume from {checkpoint}: {exc}") from None
        peft_model: NeuronPeftModel = get_peft_model(model, lora)
        peft_model.load_adapter(str(adapter), "default", is_trainable=True)
    return peft_model


def resume_model_folder(cfg: RunConfig, checkpoint: Path) -> Path:
    """The full model of ``checkpoint`` as a HF folder, written once by global rank 0, awaited by the others."""
    from llm_pipeline.consolidate import consolidate_full_checkpoint
    from llm_pipeline.errors import CheckpointError
    from llm_pipeline.weights.full_checkpoint import find_full_checkpoint

    folder = Path(cfg.paths.output_dir) / "resume" / checkpoint.name
    if os.environ.get("RANK", "0") == "0" and not (folder / "config.json").is_file():
        try:
            full = find_full_checkpoint(checkpoint)
            if full is None:
                raise CheckpointError(f"{checkpoint} holds no full-model shards/ (was it saved by a LoRA run?)")
            consolidate_full_checkpoint(full, folder, overwrite=True, base=Path(cfg.paths.model_dir))
        except CheckpointError as exc:
            raise StepError(f"cannot resume from {checkpoint}: {exc}") from None
    deadline = time.monotonic() + RESUME_WAIT_S
    while not (folder / "config.json").is_file():  # the folder appears complete (atomic rename) or not at all
        if time.monotonic() > deadline:
            raise StepError(f"gave up waiting {RESUME_WAIT_S} s for rank 0 to consolidate {checkpoint} into {folder}")
        time.sleep(5)
    return folder


def refuse_chat_records(cfg: RunConfig, dataset) -> None:
    """The fixed-length collator here trains on dolly prompt text; chat templates are the torch engine's."""
    if is_chat(dataset.column_names):
        raise StepError(
            f"data.dataset {cfg.data.dataset} holds chat-format records (messages), which the neuron backend does "
            "not train on (it formats dolly records for its fixed-length collator): convert the records to the "
            f"dolly columns ({', '.join(COLUMNS)}) or train with the torch backend"
        )


def expected_trainable(cfg: RunConfig, model_config) -> int:
    """The parameters optimum-neuron must train: LoRA's on its fused gate/up and replicated KV heads, or
    (method full) every parameter as it counts them."""
    fused_qkv = kv_size_multiplier(model_config.num_key_value_heads, cfg.parallel.tensor_parallel_size)
    if cfg.train.method == "full":
        return full_rules.parameter_count(model_config.to_dict(), fused_qkv)
    return model_shapes.expected_lora_parameters(
        model_config, cfg.lora, fused_gate_up=True, kv_size_multiplier=fused_qkv
    )


def run(cfg: RunConfig, run_parts: TrainParts, plan: TrainPlan, datasets, tokenizer) -> None:
    from llm_pipeline.weights.model_files import read_model_config

    watch = run_parts.watch
    check_neuron_run(cfg, read_model_config(cfg.paths.model_dir), f"{cfg.paths.model_dir}/config.json")
    check_parallel_layout(cfg, world_size())
    refuse_chat_records(cfg, datasets["train"])
    try:
        import torch_xla.core.xla_model as xm
        from optimum.neuron import NeuronSFTConfig, NeuronSFTTrainer
        from optimum.neuron.models.training import NeuronModelForCausalLM
    except ImportError as exc:
        raise StepError(
            f"the neuron backend needs optimum-neuron with torch-neuronx (the training image): {exc}"
        ) from None
    if "validation" in datasets:
        say("note: optimum-neuron 0.4.5 trains without evaluation; the validation split is not used here")

    args = NeuronSFTConfig(**sft_arguments(cfg, plan), **neuron_arguments(cfg))
    full = cfg.train.method == "full"
    source = cfg.paths.model_dir
    if full and plan.resume_from is not None:
        source = str(resume_model_folder(cfg, plan.resume_from))
    model = NeuronModelForCausalLM.from_pretrained(source, args.trn_config, **model_arguments(cfg))
    lora = adapter_config(cfg.train.method, cfg.lora)  # None for full
    if plan.resume_from is not None and not full:
        model = restore_adapter(cfg, model, lora, plan.resume_from)
    tokens = TokenCounter(data_collator(cfg, tokenizer))
    records, formatter = sft_inputs(cfg, datasets["train"])
    trainer: NeuronSFTTrainer = NeuronSFTTrainer(
        model=model,
        args=args,
        data_collator=tokens,
        train_dataset=records,
        processing_class=tokenizer,
        peft_config=lora,
        formatting_func=formatter,
    )
    # create_optimizer (at train()) groups the parameters by self.get_decay_parameter_names(model)
    trainer.get_decay_parameter_names = decay_parameter_names
    trainable = trainer.get_num_trainable_parameters()
    expected = expected_trainable(cfg, AutoConfig.from_pretrained(cfg.paths.model_dir))
    if full:
        check_full_trainable(trainable, expected)
    else:
        check_trainable(trainable, expected, cfg.lora)
    trainer.remove_callback(PrinterCallback)
    if plan.start_step:  # before the logger, which reads the start step at train begin
        trainer.add_callback(ContinueStepCount(trainer, plan.start_step))
    add_run_callbacks(
        trainer,
        plan,
        tokens=tokens,
        trainable=trainable,
        sequence_length=watch.sequence_length,
        seal=seal_checkpoints(args, xm.rendezvous, keep=watch.save_total_limit),
    )
    guard = NonFiniteLossGuard(grace=watch.nonfinite_loss_grace, checkpoints_dir=watch.checkpoints_dir)
    trainer.add_callback(StopAtNonFiniteLoss(guard, read_logs=True))
    trainer.train()
