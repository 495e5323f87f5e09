"""Run configs for the payload tests: tiny-cpu.toml with some keys changed, as an object or a file."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib

from llm_pipeline import config
from llm_pipeline.training.plan import TrainPlan

CONFIGS = Path(__file__).resolve().parents[2] / "payloads" / "configs"
TINY_TOML = CONFIGS / "tiny-cpu.toml"
DEFAULT_TOML = CONFIGS / "default.toml"


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def folder_env(outputs: Path, models: Path, datasets: Path) -> dict[str, str]:
    """The HPL_* variables tiny-cpu.toml reads, for a module-scoped fixture's own outputs folder."""
    return {"HPL_MODELS_DIR": str(models), "HPL_DATASETS_DIR": str(datasets), "HPL_OUTPUTS_DIR": str(outputs)}


def tiny_config(env: dict[str, str], **sections) -> config.RunConfig:
    """tiny-cpu.toml with some keys changed (validated like a file): tiny_config(env, train={"max_steps": 5})."""
    raw = _merge(tomllib.loads(TINY_TOML.read_text()), sections)
    return config.from_dict(raw, base_dir=CONFIGS, env=env)


def write_config(path: Path, env: dict[str, str], **sections) -> Path:
    """tiny-cpu.toml with the HPL_* variables filled in and some keys changed, as a file for CLI tests."""
    raw = _merge(tomllib.loads(TINY_TOML.read_text()), sections)
    lines = []
    for section, table in raw.items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            if isinstance(value, str):
                for name, env_value in env.items():
                    value = value.replace("${" + name + "}", env_value)
            lines.append(f"{key} = {json.dumps(value)}")  # JSON scalars and string lists are valid TOML
    path.write_text("\n".join(lines) + "\n")
    return path


def neuron_plan() -> TrainPlan:
    """A real neuron run from step 0 (epochs decide its length): what the neuron engine's refusals are tested with."""
    return TrainPlan(
        backend="neuron",
        max_steps=-1,
        logging_steps=10,
        save_checkpoints=True,
        resume_from=None,
        start_step=0,
        tensorboard_dir=None,
    )
