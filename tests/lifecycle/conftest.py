"""Fixtures for the lifecycle tests: fake HyperPod nodes (see lifecycle_node.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lifecycle_node import FakeNode

from tests.needs_root import require_root


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    require_root("the lifecycle tests (they change file ownership as the scripts do on a node)")
    return FakeNode(tmp_path / "node-a")


@pytest.fixture
def compute_node(node: FakeNode) -> FakeNode:
    node.add_neuron_devices()
    node.add_efa_devices(8)
    node.write_enroot_conf("ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\nENROOT_RESTRICT_DEV yes\n")
    return node


@pytest.fixture
def gpu_node(node: FakeNode) -> FakeNode:
    """A node of the p5 partition: 8 GPUs through nvidia-smi, 32 EFA devices."""
    node.add_efa_devices(32)
    return node
