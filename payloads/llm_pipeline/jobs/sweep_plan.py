"""A scaling sweep's points: the same run config at several node counts, at the same global batch.

Data-parallel replicas grow with the node count (config.data_parallel_size: TP x PP stay per node), so
the global batch (per-device batch x DP x gradient accumulation) stays put when gradient
accumulation shrinks as nodes grow: GA(n) = GA(base) x base_nodes / n. A node count that does not
divide GA(base) x base_nodes cannot keep the batch and is refused, naming what to change.

Each point gets a derived run config (``<sweep>/nodes-<n>/run.toml``): the original text with
``parallel.nodes``, ``train.gradient_accumulation_steps``, ``train.max_steps``,
``train.logging_steps`` and ``train.save_checkpoints = false`` set (a throughput run writes no
checkpoint, not even at its last step), ``paths.output_dir`` pointing at the point's own folder
(its own logs; ``data`` links to the base run's prepared data) and relative ``[paths]`` made
absolute (the config moved). Stdlib only: it runs on the controller.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from llm_pipeline.config import ConfigError, RunConfig, data_parallel_size
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import STATE_DIR

PLAN_NAME = "sweep.json"


@dataclass(frozen=True)
class SweepPoint:
    nodes: int
    gradient_accumulation_steps: int
    global_batch: int
    config: str  # the derived run config
    output_dir: str


@dataclass(frozen=True)
class BaseFacts:
    """What the sweep's plan and report record of the base run (from its RunConfig)."""

    nodes: int
    model_parallel: int  # tensor x pipeline parallel size (the report's reference shape names it)
    data_parallel: int  # the base run's replicas (config.data_parallel_size on the backend the nodes run)
    backend: str
    per_device_batch_size: int
    gradient_accumulation_steps: int
    method: str
    max_length: int
    model_id: str

    @property
    def global_batch(self) -> int:
        return self.per_device_batch_size * self.data_parallel * self.gradient_accumulation_steps


def read_base(cfg: RunConfig, backend: str) -> BaseFacts:
    """``backend``: train.backend as the partition's nodes resolve it (partitions.backend_on)."""
    return BaseFacts(
        nodes=cfg.parallel.nodes,
        model_parallel=cfg.parallel.tensor_parallel_size * cfg.parallel.pipeline_parallel_size,
        data_parallel=data_parallel_size(cfg, backend),
        backend=backend,
        per_device_batch_size=cfg.train.per_device_batch_size,
        gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
        method=cfg.train.method,
        max_length=cfg.data.max_length,
        model_id=cfg.model.id,
    )


def accumulation_for(base: BaseFacts, nodes: int) -> int:
    """Gradient accumulation at ``nodes`` that keeps the base global batch, or a ConfigError."""
    total = base.gradient_accumulation_steps * base.nodes
    if total % nodes:
        usable = [n for n in range(1, total + 1) if total % n == 0]
        raise ConfigError(
            f"{nodes} node(s) cannot keep the global batch of {base.global_batch}: train.gradient_accumulation_steps "
            f"x parallel.nodes = {total} must be divisible by the node count (usable: {usable}); raise "
            "train.gradient_accumulation_steps in the run config"
        )
    return total // nodes


def plan_sweep(
    facts: RunFacts,
    backend: str,
    sweep_dir: Path,
    node_counts: list[int],
    *,
    steps: int,
    logging_steps: int,
    overrides: dict[tuple[str, str], object] | None = None,
) -> list[SweepPoint]:
    """Write every point's run config (``facts.config`` derived, with ``overrides`` too) under ``sweep_dir``
    and return the points (smallest first)."""
    base = read_base(facts.run, backend)
    points = []
    for nodes in sorted(set(node_counts)):
        if nodes < 1:
            raise ConfigError(f"--nodes: {nodes} is not a node count")
        accumulation = accumulation_for(base, nodes)
        point_dir = sweep_dir / f"nodes-{nodes}"
        (point_dir / "logs" / STATE_DIR).mkdir(parents=True, exist_ok=True)
        keys = {
            **(overrides or {}),
            ("parallel", "nodes"): nodes,
            ("train", "gradient_accumulation_steps"): accumulation,
            ("train", "max_steps"): steps,
            ("train", "logging_steps"): logging_steps,
            ("train", "save_checkpoints"): False,
        }
        derived = write_derived(facts.config, point_dir / "run.toml", keys, run_dir=point_dir)
        global_batch = base.per_device_batch_size * (base.data_parallel * nodes // base.nodes) * accumulation
        points.append(SweepPoint(nodes, accumulation, global_batch, str(derived), str(point_dir)))
    return points


def training_summary(cfg: RunConfig) -> str:
    """The optimizer, schedule, precision and checkpointing a point's run config trains with, as one line."""
    train = cfg.train
    floor = f" to {train.min_learning_rate}" if train.lr_scheduler == "cosine_with_min_lr" else ""
    precision = "fp32"
    if train.bf16:
        masters = "fp32 master weights" if train.fp32_master_weights else "no fp32 master weights"
        precision = f"bf16 (neuron: stochastic rounding, {masters})"
    saves = f"every {train.save_steps} steps and at the end" if train.save_checkpoints else "none"
    return (
        f"AdamW lr {train.learning_rate} {train.lr_scheduler}{floor}, warm-up {train.warmup_steps} steps, "
        f"betas {train.adam_beta1}/{train.adam_beta2}, weight decay {train.weight_decay}, "
        f"{train.max_steps} steps, {precision}, checkpoints: {saves}"
    )


def write_plan(sweep_dir: Path, config: Path, base: BaseFacts, points: list[SweepPoint], jobs: dict) -> Path:
    record = {
        "config": str(config),
        "base": asdict(base),
        "points": [asdict(point) for point in points],
        "jobs": jobs,
    }
    path = sweep_dir / PLAN_NAME
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
