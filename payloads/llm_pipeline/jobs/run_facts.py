"""The few facts submit needs from a run config, read with the stdlib of Python 3.10.

submit runs on the HyperPod controller's system python3 (3.10: no tomllib, no third-party
packages), so it cannot parse a whole run config. It needs only where the run folder is
(`[paths] output_dir`, for the log folder), how many nodes train uses (`[parallel] nodes`) and
where the run goes (`[parallel] partition`, `[train] backend`, `[parallel] devices_per_node`).
This module reads just those keys; defaults and `${VAR:-default}` expansion come from
llm_pipeline.config itself (stdlib-only at import), so there is one source of truth. The whole
file is validated by the steps themselves (prepare first).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.config import ParallelConfig, PathsConfig, expand
from llm_pipeline.errors import PipelineError

_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=\s*(.*?)\s*$")


class RunFactsError(PipelineError, ValueError):
    """The run config cannot be read for submission; the message names the file and key."""


@dataclass(frozen=True)
class RunFacts:
    config: Path  # absolute
    output_dir: Path
    nodes: int
    partition: str = ""  # [parallel] partition: empty lets submit pick one (llm_pipeline.jobs.partitions)
    backend: str = "auto"  # [train] backend: which accelerator the run needs
    devices_per_node: int | None = None  # [parallel] devices_per_node when the file sets it

    @property
    def logs_dir(self) -> Path:
        return self.output_dir / "logs"


def _scalar(raw: str, where: str) -> object:
    """A TOML basic/literal string, integer, float, boolean or one-line list of basic strings, with an optional
    trailing comment."""
    if raw.startswith('"') and not raw.startswith('"""'):
        end = re.match(r'"(?:[^"\\]|\\.)*"', raw)
        if end and re.fullmatch(r"\s*(#.*)?", raw[end.end() :]):
            return json.loads(end.group(0))
    elif raw.startswith("'") and not raw.startswith("'''"):
        end = raw.find("'", 1)
        if end > 0 and re.fullmatch(r"\s*(#.*)?", raw[end + 1 :]):
            return raw[1:end]
    elif raw.startswith("["):
        array = re.fullmatch(r"(\[[^\]]*\])\s*(#.*)?", raw)
        try:
            items = json.loads(array.group(1)) if array else None
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and all(isinstance(item, str) for item in items):
            return items
    else:
        number = re.fullmatch(r"([+-]?[0-9_]+)\s*(#.*)?", raw)
        if number:
            return int(number.group(1).replace("_", ""))
        real = re.fullmatch(r"([+-]?[0-9_]+(?:\.[0-9_]+)?(?:[eE][+-]?[0-9_]+)?)\s*(#.*)?", raw)
        if real:
            return float(real.group(1).replace("_", ""))
        flag = re.fullmatch(r"(true|false)\s*(#.*)?", raw)
        if flag:
            return flag.group(1) == "true"
    raise RunFactsError(
        f"{where}: cannot read {raw!r} (write a one-line string, a number, true/false or a one-line list of "
        'double-quoted strings, e.g. ["a", "b"])'
    )


def read_key(text: str, table: str, key: str, where: str) -> object | None:
    """The value of `key` in `[table]`, or None when the file does not set it."""
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _TABLE.match(line)
        if header:
            current = header.group(1)
            continue
        match = _KEY.match(line)
        if current == table and match and match.group(1) == key:
            return _scalar(match.group(2), f"{where}:{number} {table}.{key}")
    return None


def read_run_facts(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> RunFacts:
    env = dict(os.environ if env is None else env)
    config = Path(path).expanduser().resolve()
    if not config.is_file():
        raise RunFactsError(f"run config {path} does not exist")
    text = config.read_text()
    output_dir = read_key(text, "paths", "output_dir", str(config))
    if output_dir is None:
        output_dir = PathsConfig().output_dir
    nodes = read_key(text, "parallel", "nodes", str(config))
    if nodes is None:
        nodes = ParallelConfig().nodes
    if not isinstance(output_dir, str):
        raise RunFactsError(f"{config}: paths.output_dir must be a string, got {output_dir!r}")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise RunFactsError(f"{config}: parallel.nodes must be an integer >= 1, got {nodes!r}")
    out = Path(expand(output_dir, "paths.output_dir", env)).expanduser()  # a ConfigError names the variable
    if not out.is_absolute():
        out = config.parent / out
    partition = read_key(text, "parallel", "partition", str(config))
    backend = read_key(text, "train", "backend", str(config))
    devices = read_key(text, "parallel", "devices_per_node", str(config))
    for key, value in (("parallel.partition", partition), ("train.backend", backend)):
        if value is not None and not isinstance(value, str):
            raise RunFactsError(f"{config}: {key} must be a string, got {value!r}")
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool)):
        raise RunFactsError(f"{config}: parallel.devices_per_node must be an integer, got {devices!r}")
    return RunFacts(
        config=config,
        output_dir=out,
        nodes=nodes,
        partition=partition or ParallelConfig().partition,
        backend=backend or "auto",
        devices_per_node=devices,
    )
