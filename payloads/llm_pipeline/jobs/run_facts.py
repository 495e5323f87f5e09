"""The few facts submit needs from a run config, read with the stdlib of Python 3.10.

submit runs on the HyperPod controller's system python3 (3.10: no tomllib, no third-party
packages), so it cannot parse a whole run config. It needs only where the run folder is
(`[paths] output_dir`, for the log folder), how many nodes train uses (`[parallel] nodes`) and
where the run goes (`[parallel] partition`, `[train] backend`, `[parallel] devices_per_node`).
This module reads just those keys (jobs/run_config_text.read_key); defaults and `${VAR:-default}` expansion come from
llm_pipeline.config itself (stdlib-only at import), so there is one source of truth. The whole
file is validated by the steps themselves (prepare first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.config import ParallelConfig, PathsConfig, expand
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs.run_config_text import read_key


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
