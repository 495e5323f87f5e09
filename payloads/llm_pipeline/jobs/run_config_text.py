"""Set and derive a run config as text, with the stdlib of Python 3.10: the one place a program edits one.

The smoke stage (jobs/smoke.py), the sweep (jobs/sweep_plan.py), the rehearsal (tools/rehearse.py), hpctl submit
and the tests set keys (``set_key``, ``with_keys``) or write a run derived from a config (``derived_config``,
``write_derived``: another run folder, relative paths made absolute), line by line, so comments and order survive.
It only writes: a value is read with config's one TOML reader (config.parse_toml), and programs read a config's
values from the loaded RunConfig (config.load), never key by key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from llm_pipeline.config import GRPO_REWARDS, PathsConfig, dataset_in, parse_toml

_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=\s*(.*?)\s*$")


def set_key(text: str, table: str, key: str, value: object) -> str:
    """``text`` with ``table.key = value``: the line replaced, added to the table, or a new table;
    ``value`` None: the key's line removed (the key takes its default)."""
    if value is None:
        return _without_key(text, table, key)
    toml_value = json.dumps(value)  # a string, number, boolean or list of strings: JSON writes them as TOML does
    lines = text.splitlines()
    current, table_end = "", None
    for index, line in enumerate(lines):
        header = _TABLE.match(line)
        if header:
            if current == table:
                break
            current = header.group(1)
            if current == table:
                table_end = index + 1
            continue
        if current == table:
            match = _KEY.match(line)
            if match and match.group(1) == key:
                lines[index] = f"{key} = {toml_value}"
                return "\n".join(lines) + "\n"
            if line.strip():
                table_end = index + 1
    if table_end is None:
        lines += ["", f"[{table}]", f"{key} = {toml_value}"]
    else:
        lines.insert(table_end, f"{key} = {toml_value}")
    return "\n".join(lines) + "\n"


def _without_key(text: str, table: str, key: str) -> str:
    kept, current = [], ""
    for line in text.splitlines():
        header = _TABLE.match(line)
        current = header.group(1) if header else current
        match = None if header else _KEY.match(line)
        if not (current == table and match and match.group(1) == key):
            kept.append(line)
    return "\n".join(kept) + "\n"


def with_keys(text: str, keys: Mapping[tuple[str, str], object]) -> str:
    """``text`` with every ``(table, key): value`` of ``keys`` set."""
    for (table, key), value in keys.items():
        text = set_key(text, table, key, value)
    return text


def with_absolute_paths(config: Path) -> str:
    """The text of ``config`` with its relative ``[paths]``, a relative local ``data.dataset``, relative reward
    files (grpo.rewards) and a train.init_from run name made absolute (config.load resolves them against its
    folder, or its run folder's): a copy elsewhere reads and writes the same places."""
    text, base = config.read_text(), config.resolve().parent
    tables = parse_toml(text, f"run config {config}")
    paths, data, grpo = (
        tables.get(name) if isinstance(tables.get(name), dict) else {} for name in ("paths", "data", "grpo")
    )
    rewards = grpo.get("rewards")
    if isinstance(rewards, list) and any(isinstance(item, str) and ":" in item for item in rewards):
        absolute = [
            item
            if item in GRPO_REWARDS or not isinstance(item, str) or item.startswith(("/", "$", "~"))
            else str(base / item)
            for item in rewards
        ]
        text = set_key(text, "grpo", "rewards", absolute)
    for name in PathsConfig.__dataclass_fields__:
        raw = paths.get(name)
        if isinstance(raw, str) and not raw.startswith(("/", "$", "~")):
            text = set_key(text, "paths", name, str(base / raw))
    train = tables.get("train") if isinstance(tables.get("train"), dict) else {}
    init_from, output_dir = train.get("init_from"), paths.get("output_dir", PathsConfig.output_dir)
    if isinstance(init_from, str) and init_from and "/" not in init_from and isinstance(output_dir, str):
        # a run named beside this run's folder: a copy in another folder still starts from that run
        parent = output_dir if output_dir.startswith(("/", "$", "~")) else str(base / output_dir)
        text = set_key(text, "train", "init_from", f"{parent.rstrip('/').rsplit('/', 1)[0]}/{init_from}")
    dataset = data.get("dataset")
    beside = dataset_in(dataset, base) if isinstance(dataset, str) and not dataset.startswith("$") else None
    return set_key(text, "data", "dataset", str(beside)) if beside else text


def derived_config(config: Path, run_dir: Path | str, overrides: Mapping[tuple[str, str], object]) -> str:
    """The text of ``config`` for another run in ``run_dir``: ``overrides`` set, ``paths.output_dir`` the
    run folder, relative paths made absolute (with_absolute_paths)."""
    return with_keys(with_absolute_paths(config), {**overrides, ("paths", "output_dir"): str(run_dir)})


def write_derived(
    config: Path, target: Path, keys: Mapping[tuple[str, str], object], *, run_dir: Path | str | None = None
) -> Path:
    """Write ``config`` with ``keys`` set to ``target`` (its parents made), relative paths made absolute: a
    derived run when ``run_dir`` is given (derived_config), else the same run's text with just those keys
    changed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    text = (
        derived_config(config, run_dir, keys) if run_dir is not None else with_keys(with_absolute_paths(config), keys)
    )
    target.write_text(text)
    return target
