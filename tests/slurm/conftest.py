"""One local Slurm (tools/local_slurm.py) per test worker, shared by every Slurm test module on it.

The cluster has two nodes. A module asks for ``one_node`` (a partition of node1) or ``two_nodes`` (a partition
of both); each module gets its own partition, named after it, which sbatch and srun pick up from the
environment the fixture hands out (SBATCH_PARTITION, SLURM_PARTITION). When the module ends, its partition's
jobs are cancelled and the partition deleted, so the next module on the worker starts with an empty queue.
Under ``pytest -n 2`` each worker has its own cluster (own ports, state folders and munge socket), and a
worker runs one test at a time: tests that wait for an empty queue see only their own jobs.

The modules that still start a cluster of their own are named, with the reason, in
tests/test_slurm_clusters.py (ALLOWED); that test fails on any other.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.needs_root import require_root
from tools.local_slurm import LocalSlurm, missing_binaries

SHARED_NODES = ["node1", "node2"]


@pytest.fixture(scope="module", autouse=True)
def as_root() -> None:
    """Before any cluster of the module starts: its daemons (munged, slurmctld, slurmd) run as root."""
    require_root("the local-Slurm tests (tests/slurm: munged, slurmctld and slurmd run as root)")


def require_slurm() -> None:
    """CI installs slurm-wlm and munge (.ci/run); elsewhere say how to get them."""
    missing = missing_binaries()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `apt-get install -y slurm-wlm munge` (as root)", pytrace=False)


@pytest.fixture(scope="session")
def shared_slurm(tmp_path_factory):
    """This worker's cluster: two nodes, each with every CPU of the host (a job takes a whole node's memory,
    so one job runs on a node at a time, as on the one-node clusters the modules used to start)."""
    require_root("the local-Slurm tests (tests/slurm: munged, slurmctld and slurmd run as root)")
    require_slurm()
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), nodes=len(SHARED_NODES), cpus_per_node=os.cpu_count()) as slurm:
        assert slurm.node_names == SHARED_NODES
        yield slurm


@dataclass
class Partition:
    """One module's share of the worker's cluster: what tests used of their own LocalSlurm."""

    slurm: LocalSlurm
    name: str
    node_names: list[str]

    @property
    def conf(self) -> Path:
        return self.slurm.conf

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = self.slurm.env(base)
        env["SBATCH_PARTITION"] = env["SLURM_PARTITION"] = self.name  # sbatch's and srun's default partition
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, check=check)


def module_partition(slurm: LocalSlurm, request, nodes: list[str]):
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    slurm.add_partition(name, nodes)
    try:
        yield Partition(slurm, name, nodes)
    finally:
        slurm.remove_partition(name)
        # A module that took nodes out of service (the capacity chain's scaler drains them) gives them back.
        slurm.run("scontrol", "update", f"nodename={','.join(nodes)}", "state=resume", check=False)


@pytest.fixture(scope="module")
def one_node(shared_slurm, request):
    yield from module_partition(shared_slurm, request, SHARED_NODES[:1])


@pytest.fixture(scope="module")
def two_nodes(shared_slurm, request):
    yield from module_partition(shared_slurm, request, SHARED_NODES)
