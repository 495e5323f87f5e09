"""The torchtitan ladder: one base job TOML, four rungs that each add options, a job file per rung.

A rung's job file is the base TOML (`torchtitan.job_file`) with, in this order: what the run
decides (dump folder, TensorBoard folder, tokenizer folder, steps, the staged dataset), every rung's options up to and
including this one, then the run config's `torchtitan.overrides`. It is written to
<run>/ladder/<rung>/job.toml and handed to `python -m torchtitan.train --job.config_file`.
Option names are torchtitan 0.2.2's (torchtitan/config/job_config.py and the model converter
registry in torchtitan/components/quantization/float8.py): 0.3.0 renamed or removed them.

Stdlib only (tomllib: Python 3.11+, the training image's interpreter).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from pathlib import Path
from typing import Any

import tomllib

from llm_pipeline.config import LADDER_RUNG_OPTIONS, TORCHTITAN_RUNGS, RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.run_files import TITAN_STEP

PAYLOADS_DIR = Path(__file__).resolve().parents[3]
FLOAT8_CONVERTER = "quantize.linear.float8"  # 0.2.2's registry name for the float8 nn.Linear swap

# What each rung adds to the one before it (TOML tables as dicts).
RUNG_OPTIONS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "compile": {"compile": {"enable": True, "components": ["model", "loss"]}},
    # No recipe name: 0.2.2 then builds torchao's tensorwise dynamic-scaling Float8LinearConfig.
    "fp8": {"model": {"converters": [FLOAT8_CONVERTER]}},
    "fp8_allgather": {
        "quantize": {
            "linear": {
                "float8": {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
            }
        }
    },
    # A recipe name makes 0.2.2 build torchao's Float8LinearConfig.from_recipe_name; it refuses the
    # float8 all-gather with a recipe, so this rung climbs from compile, not from fp8_allgather.
    "fp8_rowwise": {
        "model": {"converters": [FLOAT8_CONVERTER]},
        "quantize": {"linear": {"float8": {"recipe_name": "rowwise"}}},
    },
}
CLIMBS_FROM = {"fp8_rowwise": "compile"}  # rungs beside the ladder: the rung whose options they add to
RUNG_TITLES = {
    "baseline": "baseline (bf16, FSDP)",
    "compile": "+ torch.compile",
    "fp8": "+ FP8 tensorwise linears",
    "fp8_allgather": "+ FP8 all-gather, precomputed scales",
    "fp8_rowwise": "compile + FP8 rowwise linears",
}
# The figures users reported for Llama 3 8B on 4 x ml.p5.48xlarge (32 H100): tokens/s per GPU and
# the loss after 2000 steps. Shown beside the measured figures; never used as a result.
REFERENCE = {
    "setup": "Llama 3 8B, 4 x ml.p5.48xlarge (32 H100), loss after 2000 steps",
    "tps": {"baseline": 6475, "compile": 7166, "fp8": 8624, "fp8_allgather": 8950},
    "loss": {"baseline": 3.602, "compile": 3.601, "fp8": 3.612, "fp8_allgather": 3.607},
}


def import_custom_module(tables: dict[str, Any]) -> None:
    """Import the job's `experimental.custom_import` as torchtitan's Trainer does before it looks up
    `model.name` (a custom flavor registers its train spec there; see flavors.py)."""
    module = tables.get("experimental", {}).get("custom_import", "")
    if module:
        importlib.import_module(module)


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; any other value replaces the base's."""
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = merge(base[key], value)
        else:
            merged[key] = value
    return merged


def rung_options(rung: str) -> dict[str, Any]:
    """Every option from the baseline up to and including `rung` (the ladder climbs cumulatively)."""
    if rung not in RUNG_OPTIONS:
        raise StepError(f"unknown ladder rung {rung!r} (rungs: {', '.join(LADDER_RUNG_OPTIONS)})")
    if rung in CLIMBS_FROM:
        return merge(rung_options(CLIMBS_FROM[rung]), RUNG_OPTIONS[rung])
    options: dict[str, Any] = {}
    for name in TORCHTITAN_RUNGS[: TORCHTITAN_RUNGS.index(rung) + 1]:
        options = merge(options, RUNG_OPTIONS[name])
    return options


def job_file_path(cfg: RunConfig) -> Path:
    path = Path(cfg.torchtitan.job_file).expanduser()
    return path if path.is_absolute() else PAYLOADS_DIR / path


def read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise StepError(f"{what} {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise StepError(f"{what} {path} is not valid TOML: {exc}") from None


def overrides(cfg: RunConfig) -> dict[str, Any]:
    """`torchtitan.overrides` lines are TOML dotted-key assignments: parse them as one document."""
    result: dict[str, Any] = {}
    for line in cfg.torchtitan.overrides:
        try:
            result = merge(result, tomllib.loads(line))
        except tomllib.TOMLDecodeError as exc:
            raise StepError(f"torchtitan.overrides: {line!r} is not a TOML line 'section.key = value': {exc}") from None
    return result


def rung_dir(cfg: RunConfig, rung: str) -> Path:
    return Path(cfg.paths.output_dir) / "ladder" / rung


def ladder_dir(cfg: RunConfig) -> Path:
    return Path(cfg.paths.output_dir) / "ladder"


def compose(cfg: RunConfig, rung: str) -> dict[str, Any]:
    """The whole job config of one rung, as the TOML tables torchtitan reads."""
    base = read_toml(job_file_path(cfg), "torchtitan.job_file")
    run = {
        "job": {"dump_folder": str(rung_dir(cfg, rung))},
        # An absolute save_tb_folder wins over dump_folder in torchtitan's os.path.join.
        "metrics": {"save_tb_folder": str(Path(cfg.paths.tensorboard_dir) / rung)},
        "model": {"hf_assets_path": cfg.paths.model_dir},
        "training": {"steps": cfg.torchtitan.steps},
    }
    if cfg.torchtitan.dataset_source:  # the copy the dataset step staged on FSx
        run["training"]["dataset_path"] = cfg.torchtitan.dataset_dir
    # torchtitan writes both under the rung's dump folder (profiling.save_traces_folder and
    # save_memory_snapshot_folder are relative to it), so they travel to S3 with the run's outputs.
    if cfg.torchtitan.profile:
        run["profiling"] = {"enable_profiling": True}
    if cfg.torchtitan.memory_snapshot:
        run["profiling"] = {**run.get("profiling", {}), "enable_memory_snapshot": True}
    tables = merge(merge(merge(base, run), rung_options(rung)), overrides(cfg))
    return stopped(tables, cfg.torchtitan.stop_after_step)


def stopped(tables: dict[str, Any], step: int) -> dict[str, Any]:
    """torchtitan.stop_after_step: the job trains to ``step`` only (0: unchanged). torchtitan 0.2.2 has no stop
    setting, so training.steps becomes ``step``, while lr_scheduler.total_steps keeps the whole run's schedule
    (its LambdaLR restores only last_epoch on load: a schedule built for ``step`` steps would already have
    decayed) and the last save is a full checkpoint (last_save_model_only would leave nothing to resume)."""
    if not step:
        return tables
    schedule = tables.get("lr_scheduler", {}).get("total_steps") or tables["training"]["steps"]
    return merge(
        tables,
        {
            "training": {"steps": step},
            "lr_scheduler": {"total_steps": schedule},
            "checkpoint": {"last_save_model_only": False},
        },
    )


def toml_value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item, key) for item in value) + "]"
    raise StepError(f"{key}: cannot write {value!r} to a torchtitan job file")


def toml_text(tables: dict[str, Any], header: str = "") -> str:
    """TOML for nested tables of scalars and lists (what a torchtitan job file holds)."""
    lines = [f"# {line}" for line in header.splitlines()]

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if name and (scalars or not any(isinstance(v, dict) for v in table.values())):
            lines.append(f"\n[{name}]")
        for key, value in scalars.items():
            lines.append(f"{key} = {toml_value(value, f'{name}.{key}' if name else key)}")
        for key, value in table.items():
            if isinstance(value, dict):
                emit(value, f"{name}.{key}" if name else key)

    emit(tables, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def job_text(cfg: RunConfig, rung: str) -> str:
    header = (
        f"torchtitan 0.2.2 job for ladder rung {rung!r} ({RUNG_TITLES[rung]}), written by llm_pipeline.pretrain\n"
        f"from {job_file_path(cfg)} + the run's settings + rung options + torchtitan.overrides."
    )
    return toml_text(compose(cfg, rung), header)


def write_job_file(cfg: RunConfig, rung: str) -> Path:
    """Write <run>/ladder/<rung>/job.toml (atomically) and return its path."""
    folder = rung_dir(cfg, rung)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(job_text(cfg, rung))
    tmp.replace(path)
    return path


def saved_steps(tables: dict[str, Any]) -> list[int]:
    """The steps with a complete checkpoint (step-N/.metadata) in the job's checkpoint folder."""
    folder = Path(tables["job"]["dump_folder"]) / tables.get("checkpoint", {}).get("folder", "checkpoint")
    return [step for step, path in TITAN_STEP.folders(folder) if (path / ".metadata").is_file()]


def stopping_at(cfg: RunConfig, step: int) -> RunConfig:
    return dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, stop_after_step=step))


def rung_state(cfg: RunConfig, rung: str) -> str:
    """'new' (no checkpoint), 'resume' (same job, checkpoints short of the last step), 'finished'
    (same job, the last step saved), or 'changed' (checkpoints from a different job file).

    The same job stopped early (torchtitan.stop_after_step at a step it saved) counts as the same job:
    its checkpoint carries this job's schedule, and the job goes on from it."""
    steps = saved_steps(compose(cfg, rung))
    if not steps:
        return "new"
    previous = rung_dir(cfg, rung) / "job.toml"
    same = {job_text(cfg, rung)} | {
        job_text(stopping_at(cfg, step), rung) for step in steps if step < cfg.torchtitan.steps
    }
    if not previous.is_file() or previous.read_text() not in same:
        return "changed"
    last = cfg.torchtitan.stop_after_step or cfg.torchtitan.steps
    return "finished" if last in steps else "resume"
