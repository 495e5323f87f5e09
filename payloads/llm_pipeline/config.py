"""The run config: one TOML file, read by every pipeline step.

Defaults reproduce the reference blog run (Llama 3 8B, dolly 15k, one trn1.32xlarge, TP 8).
Path values may use ``${VAR}`` or ``${VAR:-default}``; the cluster's facts reach the nodes as
``HPL_*`` environment variables (see lifecycle/), so paths are never retyped here.
Relative paths (every ``[paths]`` key, and a ``data.dataset`` that names a local file: dataset_in) are
resolved against the config file's folder, so every side reads the same files whatever its working folder.

Stdlib only, Python 3.10 included (the controller's python3, which runs submit): ``load`` reads a file
with tomllib where there is one, else with tomli from the wheel shipped beside this module (TOMLI_WHEEL).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from llm_pipeline import refusals
from llm_pipeline.errors import PipelineError

# The choice keys: a key typed with one of these takes exactly its values (validate checks them).
Backend = Literal["auto", "neuron", "torch"]
Dtype = Literal["bfloat16", "float16", "float32"]
Method = Literal["lora", "dora", "qlora", "full"]
Objective = Literal["sft", "dpo", "grpo"]  # train.objective: what the loss is (train.method: what is trained)
Strategy = Literal["fsdp", "ddp"]
Attention = Literal["auto", "sdpa", "flash_attention_2", "eager"]
Optimizer = Literal["adamw_torch", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"]  # transformers' optim names
Retention = Literal["all", "last", "none"]
QloraMergeBase = Literal["dequantized", "bf16"]  # merge.qlora_base: what a qlora adapter is added to
# train.health_node_action: what the health gate (jobs/health.py) does to a node whose check failed.
HealthNodeAction = Literal["drain", "reboot", "replace"]
RolloutPlacement = Literal["auto", "colocated", "node"]  # grpo.rollout: where the vLLM rollout server runs
# grpo.server_memory's default per placement: vLLM's own default on a node of its own; beside the trainer, a share
# that leaves an 8B LoRA trainer most of the GPU
ROLLOUT_SERVER_MEMORY = {"node": 0.9, "colocated": 0.3}
BACKENDS, DTYPES, METHODS = get_args(Backend), get_args(Dtype), get_args(Method)
OBJECTIVES = get_args(Objective)
# dpo.loss_type: trl 1.16 DPOConfig's pairwise losses that need nothing beyond beta and label_smoothing
DpoLoss = Literal["sigmoid", "ipo", "hinge", "robust", "exo_pair", "sigmoid_norm", "apo_zero", "apo_down"]
DpoReference = Literal["auto", "precomputed"]
STRATEGIES, ATTENTIONS, OPTIMIZERS = get_args(Strategy), get_args(Attention), get_args(Optimizer)
QLORA_MERGE_BASES = get_args(QloraMergeBase)
# The health gate's checks by name (jobs/health.py runs them; train.health_skip may name them).
HEALTH_CHECKS = ("nvidia-smi", "dcgm-diag", "nccl-all-reduce", "neuron-ls", "neuron-memory", "nccom-all-reduce")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head")
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


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: invalid value {value!r} (allowed: {allowed})")


@dataclass(frozen=True)
class Rule:
    """What one key allows: a check and the words that say so (in the error, and for a range in the docs).
    ``each``: the check applies to every item of a list key."""

    check: Callable[[Any], bool]
    allowed: str
    each: bool = False

    def apply(self, key: str, value: Any) -> None:
        for item in value if self.each else (value,):
            _require(self.check(item), key, list(item) if isinstance(item, tuple) else item, self.allowed)


def at_least(low: int) -> Rule:
    return Rule(lambda value: value >= low, f">= {low}")


POSITIVE = Rule(lambda value: value > 0, "> 0")
FRACTION = Rule(lambda value: 0 <= value < 1, "0 <= x < 1")


def described(default: Any, description: str, *rules: Rule, learns: bool = True) -> Any:
    """A run-config field with its one-line description (the only place a key is described) and the
    rules its value must meet, whose words the description carries. ``learns``: whether a new value
    changes what a run learns (LEARNING_SECTIONS only; see learning_keys).

    The run-config tables in README.md and docs/training.md are generated from these by
    `make doc-tables` (tools/doc_tables.py); tests/docs/test_doc_tables.py fails when they drift.
    """
    return field(default=default, metadata={"description": description, "rules": rules, "learns": learns})


def ranged(default: Any, rule: Rule, description: str, *, learns: bool = True) -> Any:
    """A numeric field whose range opens its line in the doc tables (``>= 1: what it is``)."""
    metadata = {"description": description, "rules": (rule,), "range": rule.allowed, "learns": learns}
    return field(default=default, metadata=metadata)


def field_rules(cls: type) -> dict[str, tuple[Rule, ...]]:
    """{field: its rules}: those it was declared with, and a Literal type's choices."""
    hints = get_type_hints(cls)
    found = {}
    for item in dataclasses.fields(cls):
        rules = item.metadata.get("rules", ())
        if get_origin(hints[item.name]) is Literal:
            choices = get_args(hints[item.name])
            rules = (Rule(lambda value, choices=choices: value in choices, ", ".join(choices)), *rules)
        if rules:
            found[item.name] = rules
    return found


@dataclass(frozen=True)
class ModelConfig:
    id: str = described(
        "meta-llama/Meta-Llama-3-8B",
        "Hub model id; a gated model needs HF_TOKEN (or `huggingface-cli login`) with its license accepted",
    )
    dtype: Dtype = described(
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
    validation_fraction: float = ranged(
        0.0,
        FRACTION,
        "rows held out: the evaluate step scores base and tuned model on them; the torch backend also "
        "evaluates during training",
    )
    max_length: int = ranged(1024, at_least(16), "tokens per training sequence; longer than the prompt template")
    packing: bool = described(
        False,
        "pack several examples into each max_length sequence (trl best-fit-decreasing); the reference pads "
        "every example, packing is the big throughput lever",
    )
    max_samples: int = ranged(0, at_least(0), "first N rows only; 0 = all")
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
        Rule(bool, "a column name"),
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
    r: int = ranged(16, POSITIVE, "LoRA rank")
    alpha: int = ranged(16, POSITIVE, "LoRA scale numerator (scale = alpha / r)")
    dropout: float = ranged(0.05, FRACTION, "dropout on the LoRA input")
    target_modules: tuple[str, ...] = described(
        ("q_proj", "v_proj"),
        "non-empty subset of " + " ".join(LORA_MODULES) + "; gate_proj and up_proj together or neither "
        "(fused on Neuron)",
        Rule(bool, "at least one module"),
        Rule(lambda module: module in LORA_MODULES, ", ".join(LORA_MODULES), each=True),
        # The Neuron training model fuses gate/up: LoRA has to target both or neither.
        Rule(
            lambda modules: len({"gate_proj", "up_proj"} & set(modules)) != 1,
            "gate_proj and up_proj together or neither",
        ),
    )
    use_rslora: bool = described(False, "scale by alpha / sqrt(r) instead of alpha / r (rsLoRA)")

    @property
    def scale(self) -> float:
        return self.alpha / (self.r**0.5 if self.use_rslora else self.r)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = ranged(
        8, at_least(1), "tensor parallel degree; TP x PP must divide devices_per_node x nodes"
    )
    pipeline_parallel_size: int = ranged(1, at_least(1), "pipeline parallel degree")
    devices_per_node: int = ranged(
        32,
        at_least(1),
        "processes per node, one per NeuronCore or GPU; submit and prepare fail when it differs from "
        "the partition's devices (HPL_DEVICES_PER_NODE, which launch uses)",
    )
    nodes: int = ranged(1, at_least(1), "nodes of the training job (multi-node: torchrun rendezvous over EFA)")
    partition: str = described(
        "",
        "Slurm partition (one per compute group) every step runs on; empty: submit picks the first partition "
        "whose accelerator train.backend needs (neuron: Trainium, torch: GPU), else the cluster's default",
    )
    strategy: Strategy = described(
        "fsdp",
        "torch backend data parallelism: fsdp (FSDP2: full shard, activation checkpointing, bf16 mixed "
        "precision) or ddp (a full replica per GPU); the neuron backend shards by tensor_parallel_size instead",
    )


def _window_ok(window: str) -> bool:
    """A profile window's steps are in order (its form is checked first)."""
    first, _, last = window.partition("-")
    return not first or 1 <= int(first) <= int(last or first)


@dataclass(frozen=True)
class TrainConfig:
    backend: Backend = described(
        "auto", "auto (neuron when torch_xla and Neuron devices exist, else torch), neuron or torch"
    )
    per_device_batch_size: int = ranged(1, at_least(1), "sequences per device per micro-step")
    gradient_accumulation_steps: int = ranged(3, at_least(1), "micro-steps per optimizer step")
    epochs: float = ranged(3.0, POSITIVE, "passes over the training split")
    max_steps: int = ranged(
        -1,
        Rule(lambda steps: steps == -1 or steps > 0, "-1 (use epochs) or > 0"),
        "optimizer steps, overriding epochs; -1: epochs decide",
    )
    learning_rate: float = ranged(2e-5, POSITIVE, "peak learning rate")
    lr_scheduler: str = described(
        "linear",
        "a transformers scheduler: linear, cosine, cosine_with_restarts, polynomial, constant, "
        "constant_with_warmup, inverse_sqrt, cosine_with_min_lr, ... (checked when training starts)",
    )
    warmup_steps: int = ranged(0, at_least(0), "steps of linear warm-up")
    weight_decay: float = ranged(0.0, at_least(0), "AdamW weight decay")
    adam_beta1: float = ranged(0.9, FRACTION, "AdamW beta1")
    adam_beta2: float = ranged(0.999, FRACTION, "AdamW beta2 (AWS's trn1 full fine-tuning reference: 0.95)")
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
    logging_steps: int = ranged(10, at_least(1), "stdout and TensorBoard every N optimizer steps", learns=False)
    save_steps: int = ranged(500, at_least(1), "checkpoint every N steps, and always at the last step", learns=False)
    save_total_limit: int = ranged(2, at_least(1), "checkpoints kept; older ones are deleted", learns=False)
    save_checkpoints: bool = described(
        True,
        "false: no checkpoint at all, not even at the last step (throughput runs such as the sweep's points); "
        "such a run cannot resume",
        learns=False,
    )
    stop_after_step: int = described(
        0,
        "0 (off) or >= 1: end training after this optimizer step, with a checkpoint there, while the learning-rate "
        "schedule stays that of max_steps / epochs (the smoke stage's saving run: the run resumed from it trains on "
        "the same schedule as one that never stopped)",
        at_least(0),
        learns=False,
    )
    nonfinite_loss_grace: int = ranged(
        0,
        at_least(0),
        "optimizer steps in a row whose loss or gradient norm may be NaN or Inf: each such step is skipped (its "
        "update never reaches the weights or the optimizer state; counted and logged), one more stops training "
        "with an error (exit 2), and so does a bad last step; 0: stop at the first one; the neuron backend "
        "takes 0 only",
        learns=False,
    )
    max_recoveries: int = ranged(
        2,
        at_least(0),
        "times a train step whose rank died or whose node failed starts again from the newest complete checkpoint "
        "(on Slurm: in its allocation after a lost rank, requeued onto healthy nodes after a lost node; "
        "jobs/recovery.py); a step that failed with an error line of its own (a refused key, a NaN stop) is not "
        "retried; 0: never",
        learns=False,
    )
    health_skip: tuple[str, ...] = described(
        (),
        "health-gate checks this run skips, by name (the gate runs before each multi-node step on HyperPod: "
        "jobs/health.py, docs/operations.md): " + ", ".join(HEALTH_CHECKS),
        Rule(lambda name: name in HEALTH_CHECKS, ", ".join(HEALTH_CHECKS), each=True),
        learns=False,
    )
    health_node_action: HealthNodeAction = described(
        "drain",
        "what the health gate does to a node whose check failed: drain (out of service with the reason), or "
        "reboot / replace (HyperPod reboots or replaces it: Action:Reboot / Action:Replace)",
        learns=False,
    )
    precompile_steps: int = ranged(
        2,
        at_least(1),
        "optimizer steps run by `train --precompile` (under neuron_parallel_compile), each "
        "gradient_accumulation_steps micro-batches per replica; 2: the first step (the optimizer state is created) "
        "and a steady one, whose graphs later steps repeat (not measured on Trainium)",
        learns=False,
    )
    method: Method = described(
        "lora",
        "what is trained: lora (adapter), dora (weight-decomposed LoRA), qlora (LoRA on a bitsandbytes NF4 4-bit base; "
        "torch backend), full (every parameter, no adapter; merge is skipped); neuron: lora and full",
    )
    objective: Objective = described(
        "sft",
        "what the loss is: sft (next-token loss on the records' text or answers), dpo (direct preference "
        "optimization on prompt/chosen/rejected records), grpo (group relative policy optimization with rewards "
        "on completions sampled from a vLLM server); dpo and grpo on the torch backend; train.method still says "
        "what is trained",
    )
    init_from: str = described(
        "",
        "start from another finished run's merged model (its merged/ folder becomes paths.model_dir, which must then "
        "be left unset): a run folder name in the same outputs folder as paths.output_dir, or an absolute run "
        "folder; submit chains this run after that run's merge job while its chain is queued or running; empty: "
        "paths.model_dir's model",
    )
    optimizer: Optimizer = described(
        "adamw_torch",
        "AdamW implementation (torch backend): adamw_torch (fp32 moments), adamw_8bit (bitsandbytes 8-bit moments), "
        "paged_adamw_8bit or paged_adamw_32bit (bitsandbytes, state paged to host memory under pressure: QLoRA on "
        "small GPUs); the neuron backend uses its own ZeRO-1 AdamW",
    )
    compile: bool = described(False, "torch.compile the model (torch backend)", learns=False)
    liger_kernel: bool | str = described(
        "auto",
        "liger-kernel's fused RMSNorm/RoPE/SwiGLU (torch backend on CUDA; trl 1.16 keeps its own fused loss): "
        "true, false or auto; auto is on on CUDA when liger-kernel is installed (the CUDA image), else off; "
        "true needs liger-kernel and a CUDA GPU",
        Rule(lambda value: value in (True, False, "auto"), "true, false or auto"),
        learns=False,
    )
    attention: Attention = described(
        "auto",
        "attention kernel: auto, sdpa, flash_attention_2 or eager. torch: auto is flash_attention_2 on CUDA when "
        "flash-attn is installed (the CUDA image), else sdpa; flash_attention_2 needs flash-attn. neuron: auto is "
        "the NKI flash kernel when data.max_length is a multiple of 2048, else eager; "
        "sdpa is refused",
        learns=False,
    )
    profile: str = described(
        "",
        "steps to profile as 'FIRST-LAST' (e.g. '20-22'); torch.profiler writes per-rank traces (and on a GPU "
        "the allocator's memory record) under the run folder's profile/ (torch backend); empty: off",
        Rule(
            lambda window: re.fullmatch(r"(\d+)(-\d+)?", window) is not None or window == "",
            "'' (off) or a step window 'FIRST-LAST', e.g. '20-22'",
        ),
        Rule(lambda window: _window_ok(window), "1 <= FIRST <= LAST"),
        learns=False,
    )
    gradient_checkpointing: bool = described(
        False,
        "recompute activations in the backward pass: less memory, about a third more compute; when not set, on "
        "for method full and off for the adapter methods; both backends (torch: FSDP2's per decoder layer, else "
        "the Trainer's; neuron: optimum-neuron's)",
        learns=False,
    )
    global_batch_size: int = described(
        0,
        "0 (not stated) or the sequences per optimizer step the run must have: per_device_batch_size x "
        "data-parallel replicas x gradient_accumulation_steps, checked against the backend's layout",
        Rule(lambda size: size >= 0, "0 (not stated) or >= 1"),
        learns=False,
    )

    @property
    def profile_window(self) -> tuple[int, int] | None:
        """(first, last) step of the profiled window, both included; None when profiling is off."""
        if not self.profile:
            return None
        first, _, last = self.profile.partition("-")
        return int(first), int(last or first)


@dataclass(frozen=True)
class DpoConfig:
    """train.objective = "dpo" (trl's DPOTrainer on the torch backend; docs/training.md, Preference tuning)."""

    beta: float = ranged(
        0.1, POSITIVE, "how far the policy may move from the reference: higher keeps it closer (trl's beta)"
    )
    loss_type: DpoLoss = described(
        "sigmoid",
        "the preference loss: sigmoid (DPO), ipo, hinge, robust (label-noise robust, with label_smoothing), "
        "exo_pair, sigmoid_norm (length-normalized), apo_zero or apo_down (anchored)",
    )
    label_smoothing: float = ranged(
        0.0,
        Rule(lambda value: 0 <= value < 0.5, "0 <= x < 0.5"),
        "the share of preference labels assumed flipped (loss_type robust; exo_pair's epsilon); 0: none",
    )
    reference: DpoReference = described(
        "auto",
        "the reference model the policy is held to: auto (adapter methods: the policy with its adapter disabled, no "
        "second copy; full: a frozen copy of the base, its weights' memory again, stated by the dry run), "
        "precomputed (the reference's log-probabilities of every record computed once before training, then no "
        "reference is held: worth it for full, where it saves the copy)",
    )


@dataclass(frozen=True)
class GenerateConfig:
    instruction: str = described(
        "What are the main differences between a llama and an alpaca?", "the test question the generate step asks"
    )
    context: str = described("", "optional context for the question")
    max_new_tokens: int = ranged(128, at_least(1), "tokens to generate")
    temperature: float = ranged(0.0, at_least(0), "sampling temperature; 0 = greedy")


@dataclass(frozen=True)
class EvalConfig:
    max_samples: int = ranged(
        200, at_least(1), "held-out rows (data.validation_fraction) the evaluate step scores, base and tuned model"
    )
    answers: int = ranged(
        3, at_least(0), "held-out prompts answered by the base and the tuned model side by side in eval/report.md"
    )
    batch_size: int = ranged(4, at_least(1), "sequences per forward pass when scoring the held-out rows")


@dataclass(frozen=True)
class MergeConfig:
    qlora_base: QloraMergeBase = described(
        "dequantized",
        "train.method qlora: the base the adapter is added to: dequantized (each weight training held in 4-bit, "
        "quantized to NF4 with the run's settings and dequantized: the weights training computed with) or bf16 "
        "(the base folder as it is); docs/merge.md has the measured difference",
    )


# The benchmark step's default tasks for an 8B instruct fine-tune, each with its few-shot count (docs/benchmark.md says
# why these): general knowledge (MMLU), grade-school maths (GSM8K), instruction following (IFEval), science
# reasoning (ARC-Challenge) and commonsense completion (HellaSwag), at the few-shot counts of the Open LLM
# Leaderboard (v1) so the numbers compare with published ones. The download step caches their datasets.
BENCHMARK_TASKS = {"mmlu": 5, "gsm8k": 5, "ifeval": 0, "arc_challenge": 25, "hellaswag": 10}
BENCHMARK_TASK_FORM = r"[A-Za-z0-9_.-]+:[0-9]+"


@dataclass(frozen=True)
class BenchmarkConfig:
    """The benchmark step: lm-evaluation-harness scores base and tuned model through a vLLM server it starts."""

    tasks: tuple[str, ...] = described(
        (),
        "lm-eval tasks as 'name:few-shot count'; a name is one of the default set or a task of benchmark.task_dir; "
        "none: the chain has no benchmark step (opt in; docs/benchmark.md has the default set)",
        Rule(lambda item: re.fullmatch(BENCHMARK_TASK_FORM, item) is not None, "'name:few-shot count'", each=True),
        Rule(lambda items: len({i.split(":")[0] for i in items}) == len(items), "each task once"),
    )
    task_dir: str = described(
        "",
        "a folder of your own lm-eval tasks (YAML in the harness's task format, with their data), uploaded like "
        "a dataset; relative to the run config's folder",
    )
    limit: int = ranged(0, at_least(0), "examples per task; 0 = all")
    max_gen_toks: int = ranged(256, at_least(1), "generation tasks: most tokens per answer (greedy, temperature 0)")
    seed: int = ranged(1234, at_least(0), "lm-eval's random, numpy, torch and few-shot sampling seed")
    concurrency: int = ranged(4, at_least(1), "requests lm-eval sends the server at once")
    max_model_len: int = ranged(4096, at_least(16), "the vLLM server's context length (prompt + answer)")
    max_drop: float = ranged(
        1.0,
        Rule(lambda drop: 0 <= drop <= 1, "0 <= x <= 1"),
        "the gate: the chain fails, naming the task, when a task's tuned score is below its base score by more "
        "than this (scores 0 to 1); 1 = no gate",
    )

    def runs(self) -> bool:
        """The chain has a benchmark step exactly when the run asks for tasks (submit.PIPELINE)."""
        return bool(self.tasks)

    def task_shots(self) -> dict[str, int]:
        """{task: few-shot count}, in the configured order."""
        return {name: int(shots) for name, shots in (item.rsplit(":", 1) for item in self.tasks)}


# grpo.rewards' built-in reward functions (training/rewards.py defines them); any other item is a user's
# "file.py:function".
GRPO_REWARDS = ("exact_match", "format", "math_answer")
ANSWER_REWARDS = {"exact_match", "math_answer"}  # the built-ins that read the records' answer column
USER_REWARD_FORM = r"[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*"


def _reward_ok(item: str) -> bool:
    return item in GRPO_REWARDS or re.fullmatch(USER_REWARD_FORM, item) is not None


@dataclass(frozen=True)
class GrpoConfig:
    """train.objective = "grpo": trl's GRPOTrainer on completions a vLLM server samples (docs/training.md, GRPO)."""

    num_generations: int = ranged(
        4, at_least(2), "completions sampled per prompt (the group whose rewards are compared); divides the batch"
    )
    max_completion_length: int = ranged(64, at_least(1), "most tokens per sampled completion")
    temperature: float = ranged(1.0, POSITIVE, "sampling temperature of the rollouts")
    beta: float = ranged(
        0.0, at_least(0), "KL coefficient against the base model (0: no KL term; with LoRA the base is the adapter off)"
    )
    epsilon: float = ranged(0.2, POSITIVE, "clipping range of the policy ratio")
    loss_type: str = described(
        "dapo",
        "trl's loss aggregation: dapo (tokens of the whole accumulated batch), grpo (per sequence), dr_grpo, bnpo",
        Rule(lambda value: value in ("dapo", "grpo", "dr_grpo", "bnpo"), "dapo, grpo, dr_grpo, bnpo"),
    )
    scale_rewards: str = described(
        "group",
        "advantage scaling: group (by each group's reward std), batch, none",
        Rule(lambda value: value in ("group", "batch", "none"), "group, batch, none"),
    )
    rewards: tuple[str, ...] = described(
        ("exact_match",),
        "reward functions, summed: exact_match (the completion, stripped, equals the record's answer), format "
        "(grpo.format_pattern matches the completion), math_answer (the last number of the completion equals the "
        "answer's), or 'file.py:function' (your function, in a file beside the run config uploaded with the data; "
        "called as trl calls reward functions)",
        Rule(bool, "at least one reward"),
        Rule(_reward_ok, ", ".join(GRPO_REWARDS) + " or 'file.py:function'", each=True),
        Rule(lambda items: len(set(items)) == len(items), "each reward once"),
    )
    format_pattern: str = described(
        r"^\s*\d+\s*$",
        "the format reward's regular expression (Python re.search on the completion): 1 when it matches, else 0",
        Rule(lambda pattern: _compiles(pattern), "a valid regular expression"),
    )
    rollout: RolloutPlacement = described(
        "auto",
        "where the vLLM rollout server runs: node (the last node of the allocation serves, the others train), "
        "colocated (beside the trainer on its first node), auto (node with 2 or more nodes, else colocated)",
        learns=False,
    )
    sync_steps: int = ranged(
        1,
        at_least(1),
        "optimizer steps between weight syncs: the policy's adapter reaches the rollout server every N steps "
        "(1: on-policy, every step)",
    )
    server_memory: float = ranged(
        0.0,
        FRACTION,
        "the share of each GPU's memory the rollout server's vLLM may take (its --gpu-memory-utilization); 0: "
        f"{ROLLOUT_SERVER_MEMORY['node']} on a node of its own, {ROLLOUT_SERVER_MEMORY['colocated']} colocated, "
        "where the trainer holds the rest",
        learns=False,
    )

    def placement(self, nodes: int) -> str:
        """colocated or node: where the rollout server runs for an allocation of ``nodes``."""
        if self.rollout == "auto":
            return "node" if nodes > 1 else "colocated"
        return self.rollout

    def server_memory_share(self, nodes: int) -> float:
        """The GPU memory share the rollout server takes for an allocation of ``nodes``."""
        return self.server_memory or ROLLOUT_SERVER_MEMORY[self.placement(nodes)]

    def user_rewards(self) -> list[tuple[str, str]]:
        """[(file, function)] of the rewards that name a user's file."""
        return [tuple(item.rsplit(":", 1)) for item in self.rewards if item not in GRPO_REWARDS]


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


# SageMaker caps a training job's run time (and a spot job's wait) at 28 days.
JOB_MAX_HOURS = 28 * 24


@dataclass(frozen=True)
class JobConfig:
    """The run as a SageMaker training job (`hpctl job submit`); the steps never read it."""

    instance_type: str = described(
        "ml.trn1.32xlarge",
        "training job instance type (`.venv/bin/hpctl job submit --instance-type` overrides); instances: "
        "parallel.nodes",
    )
    volume_size_gb: int = ranged(
        500, at_least(1), "ML storage volume per instance: the model, the data, the run folder"
    )
    max_runtime_hours: float = ranged(
        24.0, Rule(lambda hours: 0 < hours <= JOB_MAX_HOURS, "0 < x <= 672"), "SageMaker stops the job after this long"
    )
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
        Rule(bool, "at least one rung"),
        Rule(lambda rung: rung in LADDER_RUNG_OPTIONS, ", ".join(LADDER_RUNG_OPTIONS), each=True),
        Rule(lambda rungs: len(set(rungs)) == len(rungs), "each rung once"),
    )
    steps: int = ranged(2000, at_least(1), "training steps of every rung (torchtitan training.steps)")
    stop_after_step: int = described(
        0,
        "0 (off) or 1 to steps - 1: every rung ends after this step with a full checkpoint there, its learning-rate "
        "schedule still that of torchtitan.steps (lr_scheduler.total_steps); the same rung without it resumes from "
        "that checkpoint (the smoke stage's saving rungs)",
    )
    overrides: tuple[str, ...] = described(
        (),
        "torchtitan keys set for every rung, as TOML lines, e.g. 'training.local_batch_size = 2'",
        Rule(
            lambda line: re.fullmatch(r"\s*[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+\s*=.+", line) is not None,
            "TOML lines 'section.key = value', e.g. 'training.local_batch_size = 2'",
            each=True,
        ),
    )
    export_hf: bool = described(
        True, "after the report, convert the last rung's final checkpoint to a Hugging Face folder"
    )
    checkpoint_retention: Retention = described(
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
    dpo: DpoConfig = field(default_factory=DpoConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    torchtitan: TorchtitanConfig = field(default_factory=TorchtitanConfig)
    job: JobConfig = field(default_factory=JobConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def learned(self) -> dict[str, dict[str, Any]]:
        """{section: {key: value}} of every key that changes what the run learns (learning_keys, and the keys of
        the objective's own section)."""
        own = OBJECTIVE_SECTIONS.get(self.train.objective)
        return {
            section: {key: getattr(getattr(self, section), key) for key in keys}
            for section, keys in learning_keys().items()
            if section in LEARNING_SECTIONS or section == own
        }


# The sections whose keys may change what a run learns; each field says whether it does (``learns``).
LEARNING_SECTIONS = ("model", "data", "lora", "train")
# An objective's own section (train.objective: section): its learning keys count for the runs of that objective only.
OBJECTIVE_SECTIONS = {"dpo": "dpo", "grpo": "grpo"}


def learning_keys() -> dict[str, dict[str, Any]]:
    """{section: {key: default}} of the keys whose value changes what a run learns: a finished run
    resubmitted with another value is refused (training/run_state.py); the others (logging, save cadence,
    speed levers) change nothing learned."""
    sections = {item.name: item.default_factory for item in dataclasses.fields(RunConfig)}
    return {
        name: {
            item.name: getattr(sections[name](), item.name)
            for item in dataclasses.fields(sections[name]())
            if item.metadata.get("learns", True)
        }
        for name in (*LEARNING_SECTIONS, *OBJECTIVE_SECTIONS.values())
    }


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


# The data files data.dataset may name, by suffix, and the `datasets` loader that reads each (llm_pipeline/data.py).
DATASET_FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def dataset_looks_like_a_path(spec: str) -> bool:
    """Whether data.dataset names a local file or folder rather than a Hub id (org/name): it starts with /, . or
    ~, or ends in a data file suffix (docs/custom-data.md)."""
    return spec.startswith(("/", ".", "~")) or Path(spec).suffix.lower() in DATASET_FILE_FORMATS


def dataset_in(spec: str, base_dir: Path) -> Path | None:
    """The local file or folder a relative data.dataset names in ``base_dir`` (the run config's folder): one that
    looks like a path or exists there; None for an absolute or ~ path (already where it is) and a Hub id."""
    if not spec or spec.startswith(("/", "~")):
        return None
    local = base_dir / spec
    return local if dataset_looks_like_a_path(spec) or local.exists() else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`: did you mean 'x'?` for the known name closest to a mistyped one, else nothing."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f": did you mean '{close[0]}'?" if close else ""


def _build(cls: type, table: Any, section: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"{section}.{unknown[0]}: unknown key{did_you_mean(unknown[0], fields)} (known: {', '.join(fields)})"
        )
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
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
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


def check_fields(cfg: RunConfig) -> None:
    """Every key's own rules (its choices, range or form), section by section."""
    for section in dataclasses.fields(RunConfig):
        part = getattr(cfg, section.name)
        for name, rules in field_rules(type(part)).items():
            for rule in rules:
                rule.apply(f"{section.name}.{name}", getattr(part, name))


def validate(cfg: RunConfig) -> None:
    """Each key's rules, then the checks that join keys; each failure names the key."""
    check_objective_keys(cfg)
    check_fields(cfg)
    _require(
        not (cfg.data.blocks and cfg.data.packing),
        "data.packing",
        cfg.data.packing,
        "false with data.blocks (blocks are already full)",
    )
    par, tr, titan, job = cfg.parallel, cfg.train, cfg.torchtitan, cfg.job
    world = par.devices_per_node * par.nodes
    _require(
        world % (par.tensor_parallel_size * par.pipeline_parallel_size) == 0,
        "parallel.tensor_parallel_size",
        par.tensor_parallel_size,
        f"TP x PP must divide the {world} devices (devices_per_node x nodes)",
    )
    _require(
        tr.stop_after_step == 0 or (tr.save_checkpoints and (tr.max_steps == -1 or tr.stop_after_step < tr.max_steps)),
        "train.stop_after_step",
        tr.stop_after_step,
        "0 (off), or a step before train.max_steps with train.save_checkpoints = true (the stop saves a checkpoint "
        "to resume from)",
    )
    _require(
        0 <= tr.min_learning_rate < tr.learning_rate,
        "train.min_learning_rate",
        tr.min_learning_rate,
        f">= 0 and below train.learning_rate ({tr.learning_rate})",
    )
    _require(
        not (tr.method == "dora" and "embed_tokens" in cfg.lora.target_modules),
        "lora.target_modules",
        "embed_tokens",
        "linear layers only with train.method dora (the DoRA merge handles linear layers)",
    )
    if tr.backend != "auto":
        check_backend(cfg, tr.backend)
    _require(
        0 <= titan.stop_after_step < titan.steps,
        "torchtitan.stop_after_step",
        titan.stop_after_step,
        f"0 (off) or a step before torchtitan.steps ({titan.steps})",
    )
    if titan.dataset_source:
        _require(
            bool(titan.dataset_files), "torchtitan.dataset_files", list(titan.dataset_files), "at least one pattern"
        )
        _require(Path(titan.dataset_dir).is_absolute(), "torchtitan.dataset_dir", titan.dataset_dir, "an absolute path")
    check_benchmark_tasks(cfg.benchmark)
    if tr.objective == "grpo":
        check_grpo(cfg)
    _require(
        job.max_wait_hours == 0 or job.max_runtime_hours <= job.max_wait_hours <= JOB_MAX_HOURS,
        "job.max_wait_hours",
        job.max_wait_hours,
        "0 (twice max_runtime_hours), or between job.max_runtime_hours and 672",
    )


# The objectives whose records are neither packed nor cut into blocks: (why not data.packing, why not data.blocks).
# dpo: each pair is padded on its own (trl 1.16's DPO has no packing); grpo: it samples from prompts.
UNPACKED_OBJECTIVES = {
    "dpo": ("no DPO packing", "it needs pairs"),
    "grpo": ("it samples from prompts", "it samples from prompts"),
}


def check_objective_keys(cfg: RunConfig) -> None:
    """train.method naming a loss (train.objective's), and the record layouts an objective cannot train on."""
    _require(
        cfg.train.method not in OBJECTIVES,
        "train.method",
        cfg.train.method,
        f"{', '.join(METHODS)}: {cfg.train.method} is a loss, not what is trained; set train.objective = "
        f'"{cfg.train.method}" and train.method to what it trains',
    )
    objective = cfg.train.objective
    if objective not in UNPACKED_OBJECTIVES:
        return
    no_packing, no_blocks = UNPACKED_OBJECTIVES[objective]
    _require(
        not cfg.data.packing, "data.packing", cfg.data.packing, f"false with train.objective {objective} ({no_packing})"
    )
    _require(
        not cfg.data.blocks, "data.blocks", cfg.data.blocks, f"false with train.objective {objective} ({no_blocks})"
    )


_TASK_LINE = re.compile(r"^task:\s*['\"]?([A-Za-z0-9_.-]+)", re.MULTILINE)


def custom_tasks(task_dir: str) -> set[str]:
    """The task names the YAML files of a benchmark.task_dir declare (their top-level ``task:`` lines)."""
    folder = Path(task_dir)
    if not folder.is_dir():
        raise ConfigError(
            f"benchmark.task_dir: {folder} is not a folder: upload your task folder there (docs/benchmark.md)"
        )
    found = {match for path in folder.rglob("*.y*ml") for match in _TASK_LINE.findall(path.read_text())}
    if not found:
        raise ConfigError(f"benchmark.task_dir: {folder} holds no lm-eval task YAML (a file with a 'task:' line)")
    return found


def check_benchmark_tasks(bench: BenchmarkConfig) -> None:
    """Each benchmark task is a default one or one of benchmark.task_dir's, so a typo stops at submit."""
    known = set(BENCHMARK_TASKS) | (custom_tasks(bench.task_dir) if bench.task_dir else set())
    for name in bench.task_shots():
        _require(
            name in known,
            "benchmark.tasks",
            name,
            ", ".join(sorted(known)) + " (or a task of your benchmark.task_dir)" + did_you_mean(name, known),
        )


def check_grpo(cfg: RunConfig) -> None:
    """What train.objective = "grpo" joins: a LoRA adapter (what reaches the rollout server; its prompt records:
    check_objective_keys), groups that fill the batch, a rollout node left over, the user's reward functions."""
    grpo, train, par = cfg.grpo, cfg.train, cfg.parallel
    _require(
        train.method == "lora",
        "train.method",
        train.method,
        "lora with train.objective grpo: the policy reaches the vLLM rollout server as a LoRA adapter it loads at "
        "runtime; full weights cannot be synced to it here",
    )
    placement = grpo.placement(par.nodes)
    _require(
        placement == "colocated" or par.nodes > 1,
        "grpo.rollout",
        grpo.rollout,
        "colocated or auto with parallel.nodes = 1 (node needs a node to train besides the rollout node)",
    )
    processes = par.devices_per_node * training_nodes(cfg)
    batch = train.per_device_batch_size * processes * train.gradient_accumulation_steps
    _require(
        batch % grpo.num_generations == 0,
        "grpo.num_generations",
        grpo.num_generations,
        f"a divisor of the {batch} completions per optimizer step (per_device_batch_size x {processes} training "
        "process(es) x gradient_accumulation_steps)",
    )
    for path, function in grpo.user_rewards():
        check_user_reward(path, function)


def check_user_reward(path: str, function: str) -> None:
    """A user's reward 'file.py:function': the file is there and defines the function at its top level. Read, not
    run: the submitting side never executes the user's code (the train step imports it)."""
    import ast

    key = f"grpo.rewards: {path}:{function}"
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: no such file; put it beside the run config (it is uploaded with the data)")
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: the file is not valid Python ({exc})") from None
    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if function not in defined:
        raise ConfigError(
            f"{key}: the file defines no function {function} at its top level{did_you_mean(function, defined)}"
        )


def training_nodes(cfg: RunConfig) -> int:
    """The nodes that train: all of parallel.nodes, less the rollout node of a GRPO run that has one."""
    nodes = cfg.parallel.nodes
    rollout_node = cfg.train.objective == "grpo" and cfg.grpo.placement(nodes) == "node"
    return nodes - 1 if rollout_node else nodes


def rollout_split(cfg: RunConfig) -> str | None:
    """How a GRPO run's train step shares its allocation between training and the vLLM rollout server, in words
    (the dry run's table and the estimate); None for the other objectives."""
    if cfg.train.objective != "grpo":
        return None
    nodes = cfg.parallel.nodes
    if cfg.grpo.placement(nodes) == "node":
        return (
            f"GRPO rollouts: the vLLM server on the allocation's last node, training on the other {nodes - 1} node(s)"
        )
    return f"GRPO rollouts: the vLLM server colocated with training on the {nodes} node(s)"


def data_parallel_size(cfg: RunConfig, backend: str) -> int:
    """Model replicas: neuron shards each one over TP x PP NeuronCores; torch runs one per process (FSDP/DDP)."""
    par = cfg.parallel
    processes = par.devices_per_node * training_nodes(cfg)
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
    _require(
        cfg.train.nonfinite_loss_grace == 0,
        "train.nonfinite_loss_grace",
        cfg.train.nonfinite_loss_grace,
        "0 on the neuron backend: it reads the loss at log events, after the updates, so a bad step cannot be "
        "skipped (the torch backend skips it)",
    )
    for entry in refusals.refused(cfg, refusals.NOT_TRN1):  # the one table of what a backend cannot run
        raise ConfigError(f"{entry.key}: {entry.value!r} cannot run on the neuron backend: {entry.why}")


def from_dict(raw: dict[str, Any], base_dir: Path | None = None, env: dict[str, str] | None = None) -> RunConfig:
    sections = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: unknown section{did_you_mean(unknown[0], sections)} (known: {', '.join(sections)})"
        )
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
    if parts["train"].init_from:
        parts["train"], parts["paths"] = _from_init_run(parts["train"], parts["paths"], raw, env)
    # The dataset may be a local file under a cluster folder (e.g. ${HPL_DATASETS_DIR}/dolly.jsonl), or beside
    # the config (a relative path).
    data = parts["data"]
    dataset = expand(data.dataset, "data.dataset", env)
    beside = dataset_in(dataset, base_dir) if base_dir is not None else None
    parts["data"] = dataclasses.replace(data, dataset=str(beside) if beside else dataset)
    titan = parts["torchtitan"]
    parts["torchtitan"] = dataclasses.replace(
        titan,
        dataset_source=expand(titan.dataset_source, "torchtitan.dataset_source", env),
        dataset_dir=str(Path(expand(titan.dataset_dir, "torchtitan.dataset_dir", env)).expanduser()),
    )
    bench = parts["benchmark"]
    if bench.task_dir:
        folder = Path(expand(bench.task_dir, "benchmark.task_dir", env)).expanduser()
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        parts["benchmark"] = dataclasses.replace(bench, task_dir=str(folder))
    grpo = parts["grpo"]
    if grpo.user_rewards():  # a reward file resolves like data.dataset: beside the config unless absolute
        rewards = []
        for item in grpo.rewards:
            if item in GRPO_REWARDS:
                rewards.append(item)
                continue
            path, function = item.rsplit(":", 1)
            file = Path(expand(path, "grpo.rewards", env)).expanduser()
            if not file.is_absolute() and base_dir is not None:
                file = base_dir / file
            rewards.append(f"{file}:{function}")
        parts["grpo"] = dataclasses.replace(grpo, rewards=tuple(rewards))
    train = parts["train"]
    if "gradient_checkpointing" not in raw.get("train", {}) and train.method == "full":
        # every weight's gradient and optimizer state compete with activations for memory
        parts["train"] = dataclasses.replace(train, gradient_checkpointing=True)
    cfg = RunConfig(**parts)
    validate(cfg)
    return cfg


def init_run_dir(init_from: str, output_dir: str) -> Path:
    """The run folder train.init_from names: a bare name is a run beside ``output_dir`` (the same outputs folder)."""
    return Path(init_from) if Path(init_from).is_absolute() else Path(output_dir).parent / init_from


def _from_init_run(train: TrainConfig, paths: PathsConfig, raw: dict, env) -> tuple[TrainConfig, PathsConfig]:
    """train.init_from made the absolute run folder, and paths.model_dir its merged model."""
    name = str(Path(expand(train.init_from, "train.init_from", env)).expanduser())
    if "/" in name and not Path(name).is_absolute():
        raise ConfigError(
            f"train.init_from: {name!r} is a relative path: give a run folder name (beside paths.output_dir) or an "
            "absolute run folder"
        )
    if "model_dir" in raw.get("paths", {}):
        raise ConfigError(
            "paths.model_dir: train.init_from sets it (to the named run's merged/ folder): remove one of the two"
        )
    folder = init_run_dir(name, paths.output_dir)
    if folder == Path(paths.output_dir):
        raise ConfigError(f"train.init_from: {name!r} is this run's own folder: name the finished run to start from")
    return (
        dataclasses.replace(train, init_from=str(folder)),
        # the named run's merge step output, in its run folder's layout
        dataclasses.replace(paths, model_dir=str(dataclasses.replace(paths, output_dir=str(folder)).merged_dir)),
    )


# Python 3.10 (the controller's python3, and a laptop's) has no tomllib: there run configs are read with tomli,
# tomllib's backport, from this pure-Python wheel beside this module, which Python imports from the zip as it is.
# Shipped rather than installed: the payload upload (FSx) and `pip install .` (package data) carry it, so the
# controller installs nothing and needs no network, and the tests import the very bytes it runs. Fetched at
# `make venv` (tools/ship_tomli.py checks the digest), not kept in git: it is tomli's code, not ours. 2.3.0: the last
# tomli that reads TOML 1.0, as the nodes' tomllib (Python 3.11 to 3.14) does; 2.4 reads TOML 1.1 (an inline table
# over lines, "\e"), which the nodes refuse. Another version: its wheel's name and sha256 here.
TOMLI_WHEEL = "tomli-2.3.0-py3-none-any.whl"
TOMLI_WHEEL_SHA256 = "e95b1af3c5b07d9e643909b5abbec77cd9f1217e6d0bca72b0234736b9fb1f1b"


def toml_reader() -> Any:
    """tomllib where there is one (Python 3.11+), else tomli from the shipped wheel (TOMLI_WHEEL)."""
    try:
        import tomllib

        return tomllib
    except ImportError:
        pass
    wheel = Path(__file__).with_name(TOMLI_WHEEL)
    if not wheel.is_file():
        raise ConfigError(
            f"{wheel} is missing: Python 3.10 reads run configs with it; `make venv` fetches it, then redeploy"
        )
    if str(wheel) not in sys.path:
        sys.path.insert(0, str(wheel))  # ahead of any other tomli (a distribution's)
    import tomli

    return tomli


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """The tables of a TOML text (the one reader of run configs on every side); ``where`` names it in a refusal."""
    reader = toml_reader()
    try:
        return reader.loads(text)
    except reader.TOMLDecodeError as exc:
        raise ConfigError(f"{where} is not valid TOML: {exc}") from None


def read_toml(path: Path) -> dict[str, Any]:
    """The file's tables (parse_toml)."""
    return parse_toml(path.read_text(), f"run config {path}")


def load(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> RunConfig:
    """Read and validate a run config file (on any side: the nodes, the controller, a laptop)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path} does not exist")
    return from_dict(read_toml(path), base_dir=path.resolve().parent, env=env)
