"""Local Slurm clusters for the pipeline tests (tools/local_slurm.py), one per test module.

Each cluster has its own free ports, state folders and munge socket, so every module is its own
xdist group (``slurm-<module>``): under ``pytest -n 2 --dist loadgroup`` two modules run side by side.
"""

from __future__ import annotations

import pytest

from tests.needs_root import require_root
from tools.local_slurm import LocalSlurm, missing_binaries


@pytest.fixture(scope="module", autouse=True)
def as_root() -> None:
    """Before any cluster of the module starts: its daemons (munged, slurmctld, slurmd) run as root."""
    require_root("the local-Slurm tests (tests/slurm: munged, slurmctld and slurmd run as root)")


def require_slurm() -> None:
    """CI installs slurm-wlm and munge (.ci/run); elsewhere say how to get them."""
    missing = missing_binaries()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `apt-get install -y slurm-wlm munge` (as root)", pytrace=False)


def start_cluster(tmp_path_factory, nodes: int):
    require_slurm()
    with LocalSlurm(tmp_path_factory.mktemp(f"slurm{nodes}n"), nodes=nodes) as slurm:
        yield slurm


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    yield from start_cluster(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    yield from start_cluster(tmp_path_factory, 2)
