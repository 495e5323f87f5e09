"""The run config: one TOML file, read by every pipeline step.

Defaults reproduce the reference blog run (Llama 3 8B, dolly 15k, one trn1.32xlarge, TP 8).
Path values may use ``${VAR}`` or ``${VAR:-default}``; the cluster's facts reach the nodes as
``HPL_*`` environment variables (see lifecycle/), so paths are never retyped here.
Relative paths are resolved against the config file's folder.

Importable with Python 3.10's stdlib (the controller's python3, which runs submit): tomllib is
imported only where a whole file is parsed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_pipeline.errors import PipelineError

BACKENDS = ("auto", "neuron", "torch")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head")
DTYPES = ("bfloat16", "float16", "float32")
METHODS = ("lora", "dora", "qlora", "full")
STRATEGIES = ("fsdp", "ddp")
ATTENTIONS = ("auto", "sdpa", "flash_attention_2", "eager")
OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")  # transformers' optim names
TORCHTITAN_RUNGS = ("baseline", "compile", "fp8", "fp8_allgather")  # the ladder, in climbing order
# Beside the ladder: float8 with rowwise scales (torchao's "rowwise" recipe) on top of compile.
LADDER_RUNG_OPTIONS = (*TORCHTITAN_RUNGS, "fp8_rowwise")  # every rung torchtitan.rungs may name
FP8_RUNGS = ("fp8", "fp8_allgather", "fp8_rowwise")  # rungs that need FP8 GPUs (compute capability 8.9 or newer)
# What a rung's full checkpoint holds, by rung (torchtitan 0.2.2 + torchao): plain DTensor weights under
# the baseline's names (torch.compile's wrapper name is dropped by DCP's state-dict helpers; a tensorwise or
# rowwise Float8Linear keeps a plain weight), or, with the float8 FSDP all-gather, weights of torchao's
# WeightWithDynamicFloat8CastTensor subclass (loading needs torchao.float8 imported first).
RUNG_CHECKPOINT_FORMATS = {
    "baseline": "plain",
    "compile": "plain",
    "fp8": "plain",
    "fp8_allgather": "float8 all-gather weights",
    "fp8_rowwise": "plain",
}


class ConfigError(PipelineError, ValueError):
    """A bad run config; the message names the key, the value and what is allowed."""


def described(default: Any, description: str) -> Any:
    """A run-config field with its one-line description: the only place a key is described.

    The run-config tables in README.md and docs/training.md are generated from these by
    `make doc-tables` (tools/doc_tables.py); tests/docs/test_doc_tables.py fails when they drift.
    """
    return field(default=default, metadata={"description": description})


@dataclass(frozen=True)
class ModelConfig:
    id: str = described(
        "meta-llama/Meta-Llama-3-8B",
        "Hub model id; a gated model needs HF_TOKEN (or `huggingface-cli login`) with its license accepted",
    )
    dtype: str = described(
        "bfloat16", "bfloat16, float16 or float32: the download is saved in this dtype, and generation runs in it"
    )
    revision: str = described("main", "branch, tag or commit of the Hub repo")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = described(
        "databricks/databricks-dolly-15k",
        "Hub dataset id, local .json/.jsonl/.parquet file, or folder (data files or a `save_to_disk` folder); "
        "dolly records (instruction, context, response) or chat records (messages, torch backend only)",
    )
    split: str = described("train", "split to read (Hub ids and folders)")
    validation_fraction: float = described(
        0.0,
        "0 <= x < 1: rows held out: the evaluate step scores base and tuned model on them; the torch backend also "
        "evaluates during training",
    )
    max_length: int = described(1024, ">= 16 and longer than the prompt template: tokens per training sequence")
    packing: bool = described(
        False,
        "pack several examples into each max_length sequence (trl best-fit-decreasing); the reference pads "
        "every example, packing is the big throughput lever",
    )
    max_samples: int = described(0, ">= 0: first N rows only; 0 = all")
    completion_only_loss: bool = described(
        True,
        "torch backend: the loss covers only the answer (prompt tokens labelled -100, trl's prompt-completion "
        "records), as axolotl, LLaMA-Factory and TRL do for instruction data; false: every token of the "
        "formatted text; chat records: only the assistant turns (the chat template's generation markers); "
        "the neuron backend and block mode train on the whole text",
    )
    blocks: bool = described(
        False,
        "block mode (for full fine-tuning on a corpus): every record's text + EOS is tokenized, concatenated and "
        "cut into max_length blocks (the last partial block is dropped): no padding, no per-example masking",
    )
    text_field: str = described(
        "text",
        "block mode: the column holding each record's text; a dataset without it must have the dolly columns, "
        "formatted with the prompt template",
    )


def _in_run_folder(name: str) -> property:
    """A path in the run folder (paths.output_dir), as a read-only attribute."""
    return property(lambda paths: Path(paths.output_dir) / name, doc=f"paths.output_dir / {name!r}")


@dataclass(frozen=True)
class PathsConfig:
    model_dir: str = described(
        "${HPL_MODELS_DIR:-/fsx/models}/Meta-Llama-3-8B", "base model folder (written by the download step)"
    )
    output_dir: str = described(
        "${HPL_OUTPUTS_DIR:-/fsx/outputs}/llama3-8b-dolly-lora",
        "the run folder: data/, checkpoints/, tensorboard/, adapter/, merged/, profile/, logs/, generation.txt, eval/",
    )
    compile_cache_dir: str = described(
        "${HPL_COMPILE_CACHE_DIR:-/fsx/neuron-cache}", "Neuron compile cache (the Slurm scripts' NEURON_CC_FLAGS)"
    )

    # The run folder layout every step agrees on.
    checkpoints_dir = _in_run_folder("checkpoints")
    adapter_dir = _in_run_folder("adapter")
    merged_dir = _in_run_folder("merged")
    data_dir = _in_run_folder("data")
    tensorboard_dir = _in_run_folder("tensorboard")
    profile_dir = _in_run_folder("profile")
    logs_dir = _in_run_folder("logs")
    generation_file = _in_run_folder("generation.txt")
    eval_dir = _in_run_folder("eval")


@dataclass(frozen=True)
class LoraConfig:
    r: int = described(16, "> 0: LoRA rank")
    alpha: int = described(16, "> 0: LoRA scale numerator (scale = alpha / r)")
    dropout: float = described(0.05, "0 <= x < 1: dropout on the LoRA input")
    target_modules: tuple[str, ...] = described(
        ("q_proj", "v_proj"),
        "non-empty subset of " + " ".join(LORA_MODULES) + "; gate_proj and up_proj together or neither "
        "(fused on Neuron)",
    )
    use_rslora: bool = described(False, "scale by alpha / sqrt(r) instead of alpha / r (rsLoRA)")

    @property
    def scale(self) -> float:
        return self.alpha / (self.r**0.5 if self.use_rslora else self.r)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = described(
        8, ">= 1: tensor parallel degree; TP x PP must divide devices_per_node x nodes"
    )
    pipeline_parallel_size: int = described(1, ">= 1: pipeline parallel degree")
    devices_per_node: int = described(
        32,
        ">= 1: processes per node, one per NeuronCore or GPU; submit and prepare fail when it differs from "
        "the partition's devices (HPL_DEVICES_PER_NODE, which launch uses)",
    )
    nodes: int = described(1, ">= 1: nodes of the training job (multi-node: torchrun rendezvous over EFA)")
    partition: str = described(
        "",
        "Slurm partition (one per compute group) every step runs on; empty: submit picks the first partition "
        "whose accelerator train.backend needs (neuron: Trainium, torch: GPU), else the cluster's default",
    )
    strategy: str = described(
        "fsdp",
        "torch backend data parallelism: fsdp (FSDP2: full shard, activation checkpointing, bf16 mixed "
        "precision) or ddp (a full replica per GPU); the neuron backend shards by tensor_parallel_size instead",
    )


@dataclass(frozen=True)
class TrainConfig:
    backend: str = described(
        "auto", "auto (neuron when torch_xla and Neuron devices exist, else torch), neuron or torch"
    )
    per_device_batch_size: int = described(1, ">= 1: sequences per device per micro-step")
    gradient_accumulation_steps: int = described(3, ">= 1: micro-steps per optimizer step")
    epochs: float = described(3.0, "> 0: passes over the training split")
    max_steps: int = described(-1, "-1 (epochs decide) or > 0 (optimizer steps; overrides epochs)")
    learning_rate: float = described(2e-5, "> 0: peak learning rate")
    lr_scheduler: str = described(
        "linear",
        "a transformers scheduler: linear, cosine, cosine_with_restarts, polynomial, constant, "
        "constant_with_warmup, inverse_sqrt, cosine_with_min_lr, ... (checked when training starts)",
    )
    warmup_steps: int = described(0, ">= 0: steps of linear warm-up")
    weight_decay: float = described(0.0, ">= 0: AdamW weight decay")
    adam_beta1: float = described(0.9, "0 <= x < 1: AdamW beta1")
    adam_beta2: float = described(0.999, "0 <= x < 1: AdamW beta2 (AWS's trn1 full fine-tuning reference: 0.95)")
    min_learning_rate: float = described(
        0.0, ">= 0: the floor of lr_scheduler cosine_with_min_lr (only that scheduler reads it); below learning_rate"
    )
    fp32_master_weights: bool = described(
        True,
        "neuron backend with bf16: ZeRO-1 keeps fp32 master weights and accumulates gradients in fp32 "
        "(optimum-neuron's default); false: pure bf16 with stochastic rounding, as AWS's trn1 reference trains",
    )
    bf16: bool = described(
        True,
        "compute in bf16 (both backends; CPU bf16 works too); torch backend: trainable weights stay fp32 master "
        "weights, a frozen base loads in bf16, loss and gradient reduction are fp32",
    )
    seed: int = described(42, "seeds training and the validation split")
    logging_steps: int = described(10, ">= 1: stdout and TensorBoard every N optimizer steps")
    save_steps: int = described(500, ">= 1: checkpoint every N steps, and always at the last step")
    save_total_limit: int = described(2, ">= 1: checkpoints kept; older ones are deleted")
    save_checkpoints: bool = described(
        True,
        "false: no checkpoint at all, not even at the last step (throughput runs such as the sweep's points); "
        "such a run cannot resume",
    )
    stop_after_step: int = described(
        0,
        "0 (off) or >= 1: end training after this optimizer step, with a checkpoint there, while the learning-rate "
        "schedule stays that of max_steps / epochs (the smoke stage's saving run: the run resumed from it trains on "
        "the same schedule as one that never stopped)",
    )
    nonfinite_loss_grace: int = described(
        0,
        ">= 0: optimizer steps in a row whose loss may be NaN or Inf before training stops with an error (exit 2, "
        "no checkpoint of those steps); 0: stop at the first one",
    )
    precompile_steps: int = described(
        2,
        ">= 1: optimizer steps run by `train --precompile` (under neuron_parallel_compile), each "
        "gradient_accumulation_steps micro-batches per replica; 2: the first step (the optimizer state is created) "
        "and a steady one, whose graphs later steps repeat (not measured on Trainium)",
    )
    method: str = described(
        "lora",
        "what is trained: lora (adapter), dora (weight-decomposed LoRA), qlora (LoRA on a bitsandbytes NF4 4-bit base; "
        "torch backend), full (every parameter, no adapter; merge is skipped); neuron: lora and full",
    )
    optimizer: str = described(
        "adamw_torch",
        "AdamW implementation (torch backend): adamw_torch (fp32 moments), adamw_8bit (bitsandbytes 8-bit moments), "
        "paged_adamw_8bit or paged_adamw_32bit (bitsandbytes, state paged to host memory under pressure: QLoRA on "
        "small GPUs); the neuron backend uses its own ZeRO-1 AdamW",
    )
    compile: bool = described(False, "torch.compile the model (torch backend)")
    liger_kernel: bool | str = described(
        "auto",
        "liger-kernel's fused RMSNorm/RoPE/SwiGLU (torch backend on CUDA; trl 1.16 keeps its own fused loss): "
        "true, false or auto; auto is on on CUDA when liger-kernel is installed (the CUDA image), else off; "
        "true needs liger-kernel and a CUDA GPU",
    )
    attention: str = described(
        "auto",
        "attention kernel: auto, sdpa, flash_attention_2 or eager. torch: auto is flash_attention_2 on CUDA when "
        "flash-attn is installed (the CUDA image), else sdpa; flash_attention_2 needs flash-attn. neuron: auto is "
        "the NKI flash kernel when data.max_length is a multiple of 2048, else eager; "
        "sdpa is refused",
    )
    profile: str = described(
        "",
        "steps to profile as 'FIRST-LAST' (e.g. '20-22'); torch.profiler writes per-rank traces and a memory "
        "timeline under the run folder's profile/ (torch backend); empty: off",
    )
    gradient_checkpointing: bool = described(
        False,
        "recompute activations in the backward pass: less memory, about a third more compute; when not set, on "
        "for method full and off for the adapter methods; both backends (torch: FSDP2's per decoder layer, else "
        "the Trainer's; neuron: optimum-neuron's)",
    )
    global_batch_size: int = described(
        0,
        "0 (not stated) or the sequences per optimizer step the run must have: per_device_batch_size x "
        "data-parallel replicas x gradient_accumulation_steps, checked against the backend's layout",
    )

    @property
    def profile_window(self) -> tuple[int, int] | None:
        """(first, last) step of the profiled window, both included; None when profiling is off."""
        if not self.profile:
            return None
        first, _, last = self.profile.partition("-")
        return int(first), int(last or first)


@dataclass(frozen=True)
class GenerateConfig:
    instruction: str = described(
        "What are the main differences between a llama and an alpaca?", "the test question the generate step asks"
    )
    context: str = described("", "optional context for the question")
    max_new_tokens: int = described(128, ">= 1: tokens to generate")
    temperature: float = described(0.0, ">= 0: sampling temperature; 0 = greedy")


@dataclass(frozen=True)
class EvalConfig:
    max_samples: int = described(
        200, ">= 1: held-out rows (data.validation_fraction) the evaluate step scores, base and tuned model"
    )
    answers: int = described(
        3, ">= 0: held-out prompts answered by the base and the tuned model side by side in eval/report.md"
    )
    batch_size: int = described(4, ">= 1: sequences per forward pass when scoring the held-out rows")


# SageMaker caps a training job's run time (and a spot job's wait) at 28 days.
JOB_MAX_HOURS = 28 * 24


@dataclass(frozen=True)
class JobConfig:
    """The run as a SageMaker training job (`hpctl job submit`); the steps never read it."""

    instance_type: str = described(
        "ml.trn1.32xlarge",
        "training job instance type (`hpctl job submit --instance-type` overrides); instances: parallel.nodes",
    )
    volume_size_gb: int = described(500, ">= 1: ML storage volume per instance: the model, the data, the run folder")
    max_runtime_hours: float = described(24.0, "0 < x <= 672: SageMaker stops the job after this long")
    spot: bool = described(
        False, "managed spot training: billed at the spot price, may be interrupted; resumes from its checkpoints"
    )
    max_wait_hours: float = described(
        0.0, "spot only: capacity wait plus run time before SageMaker gives up (0: twice max_runtime_hours)"
    )


@dataclass(frozen=True)
class TorchtitanConfig:
    job_file: str = described(
        "configs/torchtitan/llama3_8b.toml",
        "pretraining ladder (docs/pretraining.md): the torchtitan 0.2.2 job TOML every rung starts from; "
        "a relative path is read under payloads/",
    )
    rungs: tuple[str, ...] = described(
        TORCHTITAN_RUNGS,
        "ladder rungs to run, in order, each adding its options to the one before: baseline, compile, "
        "fp8 (tensorwise float8 linears), fp8_allgather (+ float8 FSDP all-gather, precomputed scales); "
        "or fp8_rowwise (compile + float8 linears with rowwise scales)",
    )
    steps: int = described(2000, "training steps of every rung (torchtitan training.steps)")
    stop_after_step: int = described(
        0,
        "0 (off) or 1 to steps - 1: every rung ends after this step with a full checkpoint there, its learning-rate "
        "schedule still that of torchtitan.steps (lr_scheduler.total_steps); the same rung without it resumes from "
        "that checkpoint (the smoke stage's saving rungs)",
    )
    overrides: tuple[str, ...] = described(
        (), "torchtitan keys set for every rung, as TOML lines, e.g. 'training.local_batch_size = 2'"
    )
    export_hf: bool = described(
        True, "after the report, convert the last rung's final checkpoint to a Hugging Face folder"
    )
    checkpoint_retention: str = described(
        "last",
        "what a finished rung keeps of its checkpoints: all, last (its final step: the export's input and the "
        "resubmission's proof it finished), none (nothing once the report read its metrics; the exported rung "
        "keeps its last)",
    )
    profile: bool = described(
        False,
        "torchtitan's torch.profiler traces (profiling.enable_profiling, every profiling.profile_freq steps) "
        "into <run>/ladder/<rung>/profile_traces",
    )
    memory_snapshot: bool = described(
        False,
        "torchtitan's CUDA memory snapshots (profiling.enable_memory_snapshot) into "
        "<run>/ladder/<rung>/memory_snapshot",
    )
    dataset_source: str = described(
        "allenai/c4",
        "Hub dataset id, or a folder (e.g. an FSx import of an S3 copy), that the dataset step stages into "
        "torchtitan.dataset_dir once for every rung to read; empty: no staging, every rank streams from the Hub",
    )
    dataset_files: tuple[str, ...] = described(
        ("en/c4-train.0000[0-7]-of-01024.json.gz", "en/c4-validation.00000-of-00008.json.gz"),
        "glob patterns of the source's data files to stage (8 c4 shards: about 1.4 billion tokens); the "
        "dataset card (README.md, which defines c4's 'en' config) always comes along",
    )
    dataset_dir: str = described(
        "${HPL_DATASETS_DIR:-/fsx/datasets}/c4",
        "where the staged dataset lives on FSx; every rung reads it (torchtitan training.dataset_path)",
    )


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    torchtitan: TorchtitanConfig = field(default_factory=TorchtitanConfig)
    job: JobConfig = field(default_factory=JobConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(value: str, key: str, env: dict[str, str] | None = None) -> str:
    """Expand ``${VAR}`` / ``${VAR:-default}``; an unset variable without default is an error."""
    env = os.environ if env is None else env

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{key}: environment variable {name} is not set (value {value!r})")

    return _VAR.sub(sub, value)


def _build(cls: type, table: Any, section: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}: unknown key (known: {', '.join(fields)})")
    values = {}
    for name, value in table.items():
        default = getattr(cls(), name)
        key = f"{section}.{name}"
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{key}: expected true or false, got {value!r}")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{key}: expected an integer, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key}: expected a number, got {value!r}")
            value = float(value)
        elif isinstance(default, str):
            # a `bool | str` key (true, false or "auto") takes a boolean too
            if not isinstance(value, str) and not (isinstance(value, bool) and fields[name].type == "bool | str"):
                raise ConfigError(f"{key}: expected a string, got {value!r}")
        elif isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
            value = tuple(value)
        values[name] = value
    return cls(**values)


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: invalid value {value!r} (allowed: {allowed})")


def validate(cfg: RunConfig) -> None:
    """Cross-field and range checks; each failure names the key."""
    _require(cfg.model.dtype in DTYPES, "model.dtype", cfg.model.dtype, ", ".join(DTYPES))
    _require(
        0.0 <= cfg.data.validation_fraction < 1.0,
        "data.validation_fraction",
        cfg.data.validation_fraction,
        "0 <= x < 1",
    )
    _require(cfg.data.max_length >= 16, "data.max_length", cfg.data.max_length, ">= 16")
    _require(cfg.data.max_samples >= 0, "data.max_samples", cfg.data.max_samples, ">= 0")
    _require(
        not (cfg.data.blocks and cfg.data.packing),
        "data.packing",
        cfg.data.packing,
        "false with data.blocks (blocks are already full)",
    )
    _require(bool(cfg.data.text_field), "data.text_field", cfg.data.text_field, "a column name")
    _require(cfg.lora.r > 0, "lora.r", cfg.lora.r, "> 0")
    _require(cfg.lora.alpha > 0, "lora.alpha", cfg.lora.alpha, "> 0")
    _require(0.0 <= cfg.lora.dropout < 1.0, "lora.dropout", cfg.lora.dropout, "0 <= x < 1")
    _require(
        len(cfg.lora.target_modules) > 0, "lora.target_modules", list(cfg.lora.target_modules), "at least one module"
    )
    for module in cfg.lora.target_modules:
        _require(module in LORA_MODULES, "lora.target_modules", module, ", ".join(LORA_MODULES))
    # The Neuron training model fuses gate/up: LoRA has to target both or neither.
    gate_up = {"gate_proj", "up_proj"} & set(cfg.lora.target_modules)
    _require(len(gate_up) != 1, "lora.target_modules", sorted(gate_up), "gate_proj and up_proj together or neither")
    par = cfg.parallel
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "devices_per_node", "nodes"):
        _require(getattr(par, name) >= 1, f"parallel.{name}", getattr(par, name), ">= 1")
    world = par.devices_per_node * par.nodes
    model_parallel = par.tensor_parallel_size * par.pipeline_parallel_size
    _require(
        world % model_parallel == 0,
        "parallel.tensor_parallel_size",
        par.tensor_parallel_size,
        f"TP x PP must divide the {world} devices (devices_per_node x nodes)",
    )
    tr = cfg.train
    _require(tr.backend in BACKENDS, "train.backend", tr.backend, ", ".join(BACKENDS))
    for name in (
        "per_device_batch_size",
        "gradient_accumulation_steps",
        "logging_steps",
        "save_steps",
        "precompile_steps",
    ):
        _require(getattr(tr, name) >= 1, f"train.{name}", getattr(tr, name), ">= 1")
    _require(tr.max_steps == -1 or tr.max_steps > 0, "train.max_steps", tr.max_steps, "-1 (use epochs) or > 0")
    _require(tr.epochs > 0, "train.epochs", tr.epochs, "> 0")
    _require(tr.stop_after_step >= 0, "train.stop_after_step", tr.stop_after_step, ">= 0")
    _require(tr.nonfinite_loss_grace >= 0, "train.nonfinite_loss_grace", tr.nonfinite_loss_grace, ">= 0")
    _require(
        tr.stop_after_step == 0 or (tr.save_checkpoints and (tr.max_steps == -1 or tr.stop_after_step < tr.max_steps)),
        "train.stop_after_step",
        tr.stop_after_step,
        "0 (off), or a step before train.max_steps with train.save_checkpoints = true (the stop saves a checkpoint "
        "to resume from)",
    )
    _require(tr.learning_rate > 0, "train.learning_rate", tr.learning_rate, "> 0")
    _require(tr.warmup_steps >= 0, "train.warmup_steps", tr.warmup_steps, ">= 0")
    _require(tr.weight_decay >= 0, "train.weight_decay", tr.weight_decay, ">= 0")
    for name in ("adam_beta1", "adam_beta2"):
        _require(0 <= getattr(tr, name) < 1, f"train.{name}", getattr(tr, name), "0 <= x < 1")
    _require(
        0 <= tr.min_learning_rate < tr.learning_rate,
        "train.min_learning_rate",
        tr.min_learning_rate,
        f">= 0 and below train.learning_rate ({tr.learning_rate})",
    )
    _require(tr.save_total_limit >= 1, "train.save_total_limit", tr.save_total_limit, ">= 1")
    _require(tr.global_batch_size >= 0, "train.global_batch_size", tr.global_batch_size, "0 (not stated) or >= 1")
    _require(tr.method in METHODS, "train.method", tr.method, ", ".join(METHODS))
    _require(par.strategy in STRATEGIES, "parallel.strategy", par.strategy, ", ".join(STRATEGIES))
    _require(tr.attention in ATTENTIONS, "train.attention", tr.attention, ", ".join(ATTENTIONS))
    _require(tr.liger_kernel in (True, False, "auto"), "train.liger_kernel", tr.liger_kernel, "true, false or auto")
    _require(tr.optimizer in OPTIMIZERS, "train.optimizer", tr.optimizer, ", ".join(OPTIMIZERS))
    _require(
        re.fullmatch(r"(\d+)(-\d+)?", tr.profile) is not None or tr.profile == "",
        "train.profile",
        tr.profile,
        "'' (off) or a step window 'FIRST-LAST', e.g. '20-22'",
    )
    if tr.profile_window is not None:
        first, last = tr.profile_window
        _require(1 <= first <= last, "train.profile", tr.profile, "1 <= FIRST <= LAST")
    _require(
        not (tr.method == "dora" and "embed_tokens" in cfg.lora.target_modules),
        "lora.target_modules",
        "embed_tokens",
        "linear layers only with train.method dora (the DoRA merge handles linear layers)",
    )
    if tr.backend != "auto":
        check_backend(cfg, tr.backend)
    _require(cfg.generate.max_new_tokens >= 1, "generate.max_new_tokens", cfg.generate.max_new_tokens, ">= 1")
    _require(cfg.generate.temperature >= 0, "generate.temperature", cfg.generate.temperature, ">= 0")
    _require(cfg.eval.max_samples >= 1, "eval.max_samples", cfg.eval.max_samples, ">= 1")
    _require(cfg.eval.answers >= 0, "eval.answers", cfg.eval.answers, ">= 0")
    _require(cfg.eval.batch_size >= 1, "eval.batch_size", cfg.eval.batch_size, ">= 1")
    titan = cfg.torchtitan
    _require(len(titan.rungs) > 0, "torchtitan.rungs", list(titan.rungs), "at least one rung")
    for rung in titan.rungs:
        _require(rung in LADDER_RUNG_OPTIONS, "torchtitan.rungs", rung, ", ".join(LADDER_RUNG_OPTIONS))
    _require(len(set(titan.rungs)) == len(titan.rungs), "torchtitan.rungs", list(titan.rungs), "each rung once")
    _require(titan.steps >= 1, "torchtitan.steps", titan.steps, ">= 1")
    _require(
        0 <= titan.stop_after_step < titan.steps,
        "torchtitan.stop_after_step",
        titan.stop_after_step,
        f"0 (off) or a step before torchtitan.steps ({titan.steps})",
    )
    retentions = ("all", "last", "none")
    _require(
        titan.checkpoint_retention in retentions,
        "torchtitan.checkpoint_retention",
        titan.checkpoint_retention,
        ", ".join(retentions),
    )
    if titan.dataset_source:
        _require(
            bool(titan.dataset_files), "torchtitan.dataset_files", list(titan.dataset_files), "at least one pattern"
        )
        _require(Path(titan.dataset_dir).is_absolute(), "torchtitan.dataset_dir", titan.dataset_dir, "an absolute path")
    for line in titan.overrides:
        _require(
            re.fullmatch(r"\s*[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+\s*=.+", line) is not None,
            "torchtitan.overrides",
            line,
            "TOML lines 'section.key = value', e.g. 'training.local_batch_size = 2'",
        )
    job = cfg.job
    _require(job.volume_size_gb >= 1, "job.volume_size_gb", job.volume_size_gb, ">= 1")
    _require(0 < job.max_runtime_hours <= JOB_MAX_HOURS, "job.max_runtime_hours", job.max_runtime_hours, "0 < x <= 672")
    _require(
        job.max_wait_hours == 0 or job.max_runtime_hours <= job.max_wait_hours <= JOB_MAX_HOURS,
        "job.max_wait_hours",
        job.max_wait_hours,
        "0 (twice max_runtime_hours), or between job.max_runtime_hours and 672",
    )


# What the neuron backend cannot run today, and what to do instead.
NEURON_REFUSALS = {
    ("method", "dora"): "DoRA needs peft's weight-decomposed layers, which optimum-neuron does not shard; "
    "use method lora, or the torch backend",
    ("method", "qlora"): "4-bit NF4 bases need bitsandbytes CUDA kernels; use method lora, or the torch backend",
    ("compile", True): "neuronx-cc already compiles every graph; set it to false",
    ("liger_kernel", True): "liger-kernel is Triton (GPU) code; set it to false",
    ("attention", "sdpa"): "optimum-neuron 0.4.5 refuses SDPA; use auto (the NKI flash kernel when "
    "data.max_length is a multiple of 2048, else eager), flash_attention_2 or eager",
}


def data_parallel_size(cfg: RunConfig, backend: str) -> int:
    """Model replicas: neuron shards each one over TP x PP NeuronCores; torch runs one per process (FSDP/DDP)."""
    par = cfg.parallel
    processes = par.devices_per_node * par.nodes
    return processes // (par.tensor_parallel_size * par.pipeline_parallel_size) if backend == "neuron" else processes


def check_global_batch(cfg: RunConfig, backend: str) -> None:
    """train.global_batch_size, when stated, must be what the layout gives."""
    stated, train = cfg.train.global_batch_size, cfg.train
    if not stated:
        return
    replicas = data_parallel_size(cfg, backend)
    actual = train.per_device_batch_size * replicas * train.gradient_accumulation_steps
    if actual != stated:
        wanted, remainder = divmod(stated, train.per_device_batch_size * replicas)
        hint = (
            f"set train.gradient_accumulation_steps = {wanted}"
            if wanted and not remainder
            else "change per_device_batch_size, gradient_accumulation_steps or the layout"
        )
        raise ConfigError(
            f"train.global_batch_size: {stated} stated, but per_device_batch_size {train.per_device_batch_size} x "
            f"{replicas} data-parallel replica(s) ({backend} backend) x gradient_accumulation_steps "
            f"{train.gradient_accumulation_steps} = {actual}: {hint}"
        )


def check_backend(cfg: RunConfig, backend: str) -> None:
    """Refuse a train.* setting the chosen backend cannot run (called at load and at prepare)."""
    check_global_batch(cfg, backend)
    if backend != "neuron":
        return
    for (name, value), reason in NEURON_REFUSALS.items():
        if getattr(cfg.train, name) == value:
            raise ConfigError(f"train.{name}: {value!r} cannot run on the neuron backend: {reason}")


def from_dict(raw: dict[str, Any], base_dir: Path | None = None, env: dict[str, str] | None = None) -> RunConfig:
    sections = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(sections)})")
    parts = {}
    for f in dataclasses.fields(RunConfig):
        cls = type(f.default_factory())
        parts[f.name] = _build(cls, raw.get(f.name, {}), f.name)
    paths = parts["paths"]
    resolved = {}
    for f in dataclasses.fields(PathsConfig):
        value = Path(expand(getattr(paths, f.name), f"paths.{f.name}", env)).expanduser()
        if not value.is_absolute() and base_dir is not None:
            value = base_dir / value
        resolved[f.name] = str(value)
    parts["paths"] = PathsConfig(**resolved)
    # The dataset may be a local file under a cluster folder (e.g. ${HPL_DATASETS_DIR}/dolly.jsonl).
    data = parts["data"]
    parts["data"] = dataclasses.replace(data, dataset=expand(data.dataset, "data.dataset", env))
    titan = parts["torchtitan"]
    parts["torchtitan"] = dataclasses.replace(
        titan,
        dataset_source=expand(titan.dataset_source, "torchtitan.dataset_source", env),
        dataset_dir=str(Path(expand(titan.dataset_dir, "torchtitan.dataset_dir", env)).expanduser()),
    )
    train = parts["train"]
    if "gradient_checkpointing" not in raw.get("train", {}) and train.method == "full":
        # every weight's gradient and optimizer state compete with activations for memory
        parts["train"] = dataclasses.replace(train, gradient_checkpointing=True)
    cfg = RunConfig(**parts)
    validate(cfg)
    return cfg


def load(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> RunConfig:
    """Read and validate a run config file."""
    import tomllib  # Python 3.11+: the steps run in the training image, never on the controller

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"run config {path} is not valid TOML: {exc}") from None
    return from_dict(raw, base_dir=path.resolve().parent, env=env)


def _show(argv: list[str] | None = None) -> int:
    """`python -m llm_pipeline.config --show RUN.toml`: the resolved config (config_show.py, not loaded on import)."""
    from llm_pipeline.config_show import main

    return main(argv)


if __name__ == "__main__":
    raise SystemExit(_show())
