"""What submit knows of a run: its loaded run config, and where its chain's jobs go.

submit runs on the HyperPod controller's system python3 (3.10: no tomllib, no third-party packages); it
loads the whole run config with config.load all the same (tomllib's backport tomli from the wheel the payloads
ship, where tomllib is missing), so the controller, the nodes and a laptop hold the same RunConfig and its rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline import config as run_config
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import PipelineError


class RunFactsError(PipelineError, ValueError):
    """The run config cannot be read for submission; the message names the file and key."""


@dataclass(frozen=True)
class RunFacts:
    """Where a chain's jobs go: a run config, its run folder and the node count of its multi-node jobs
    (a sweep point or the smoke run: a derived config in another folder)."""

    config: Path  # absolute
    output_dir: Path
    nodes: int
    run: RunConfig | None = None  # the loaded run config (read_run_facts); a derived target has none
    devices_stated: bool = False  # whether the file sets parallel.devices_per_node (else: the partition's)

    @property
    def logs_dir(self) -> Path:
        return self.output_dir / "logs"

    @property
    def partition(self) -> str:
        return self.run.parallel.partition if self.run else ""

    @property
    def backend(self) -> str:
        return self.run.train.backend if self.run else "auto"

    @property
    def devices_per_node(self) -> int | None:
        """parallel.devices_per_node when the file sets it (the partition's otherwise)."""
        return self.run.parallel.devices_per_node if self.run and self.devices_stated else None


def read_run_facts(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> RunFacts:
    env = dict(os.environ if env is None else env)
    config = Path(path).expanduser().resolve()
    if not config.is_file():
        raise RunFactsError(f"run config {path} does not exist")
    raw = run_config.read_toml(config)
    cfg = run_config.from_dict(raw, base_dir=config.parent, env=env)
    parallel = raw.get("parallel", {})
    stated = isinstance(parallel, dict) and "devices_per_node" in parallel
    return RunFacts(config, Path(cfg.paths.output_dir), cfg.parallel.nodes, cfg, stated)
