"""The node's Slurm version in the log, and the controller refusing the topology setup that leaves no job
runnable (HyperPod's automatic topology on Slurm 25.11 AMIs, as other projects reported it)."""

from __future__ import annotations

import pytest
from lifecycle_node import COMPUTE_IPS, CONTROLLER_IP, SLURM_CONF, FakeNode

PLUGIN = "TopologyPlugin=topology/tree"
PARTITION_TOPOLOGY = "PartitionName=p5 Nodes=ip-10-1-2-[1-2] Topology=tree State=UP"


def test_every_node_logs_its_slurm_version(compute_node: FakeNode) -> None:
    run = compute_node.run(COMPUTE_IPS[0], FAKE_SLURM_VERSION="25.11.2")

    assert run.returncode == 0, run.stderr
    assert "[slurm-version] slurm 25.11.2 (from sinfo --version)" in run.stdout
    assert run.called("sinfo") == ["sinfo --version"]


def test_the_next_command_reports_the_version_where_sinfo_fails(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP, FAKE_SLURM_VERSION="24.11.0", FAKE_SLURM_FAIL="sinfo")

    assert run.returncode == 0, run.stderr
    assert "[slurm-version] slurm 24.11.0 (from scontrol --version)" in run.stdout
    assert "WARNING" not in run.stdout


def test_no_version_is_a_warning(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP, FAKE_SLURM_FAIL="sinfo scontrol slurmd slurmctld")

    assert run.returncode == 0, run.stderr
    assert (
        "[slurm-version] WARNING: Slurm version unknown: sinfo --version: sinfo: fatal: Could not establish a"
        " configuration source;scontrol --version: scontrol: fatal:"
    ) in run.stdout
    assert run.called("slurmctld") == ["slurmctld -V"]


def test_controller_without_topology_passes(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert "[slurm-topology] no topology plugin or partition topology in /opt/slurm/etc/slurm.conf" in run.stdout
    assert "WARNING" not in run.stdout


@pytest.mark.parametrize(
    ("line", "files"),
    [
        (PLUGIN, {}),  # PR 14's report: the plugin and no topology.conf
        (PLUGIN, {"topology.conf": "# managed by HyperPod\n"}),
        (PARTITION_TOPOLOGY, {"topology.yaml": "[]\n", "topology.conf": ""}),  # PR 23's report
        ("TopologyPlugin = topology/block", {"topology.yaml": "# none yet\n\n"}),
    ],
    ids=["plugin-no-file", "plugin-empty-conf", "partition-empty-yaml", "block-comment-only-yaml"],
)
def test_controller_refuses_topology_with_nothing_to_describe_it(
    node: FakeNode, line: str, files: dict[str, str]
) -> None:
    (node.slurm_etc / "slurm.conf").write_text(SLURM_CONF + line + "\n")
    for name, text in files.items():
        (node.slurm_etc / name).write_text(text)

    run = node.run(CONTROLLER_IP)

    assert run.returncode != 0
    assert f"ERROR in step slurm-topology: /opt/slurm/etc/slurm.conf:6 enables topology ('{line}')" in run.stderr
    assert "Requested topology configuration is not available" in run.stderr
    assert "update-cluster-software" in run.stderr
    assert not (node.root / "etc/update-motd.d/99-hyperpod-lora").exists()
    assert (node.slurm_etc / "slurm.conf").read_text() == SLURM_CONF + line + "\n"  # HyperPod's file, not ours


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("topology.conf", "SwitchName=s0 Nodes=ip-10-1-1-[1-4]\n"),
        ("topology.conf", "BlockName=b0 Nodes=ip-10-1-2-[1-2]\n"),
        ("topology.yaml", "- topology: default\n  cluster_default: true\n  tree:\n    switches: []\n"),
    ],
)
def test_controller_accepts_topology_that_is_described(node: FakeNode, name: str, text: str) -> None:
    (node.slurm_etc / "slurm.conf").write_text(SLURM_CONF + PLUGIN + "\n" + PARTITION_TOPOLOGY + "\n")
    (node.slurm_etc / name).write_text(text)

    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert "[slurm-topology] topology in use (/opt/slurm/etc/slurm.conf:6)" in run.stdout


def test_commented_plugin_line_is_not_topology(node: FakeNode) -> None:
    (node.slurm_etc / "slurm.conf").write_text(SLURM_CONF + "#" + PLUGIN + "\n")

    assert node.run(CONTROLLER_IP).returncode == 0


def test_compute_nodes_leave_topology_to_the_controller(compute_node: FakeNode) -> None:
    (compute_node.slurm_etc / "slurm.conf").write_text(SLURM_CONF + PLUGIN + "\n")

    run = compute_node.run(COMPUTE_IPS[1])

    assert run.returncode == 0, run.stderr
    assert "slurm-topology" not in run.stdout


def test_controller_without_slurm_conf_warns(node: FakeNode) -> None:
    (node.slurm_etc / "slurm.conf").unlink()

    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    warning = "[slurm-topology] WARNING: /opt/slurm/etc/slurm.conf not found: Slurm's topology setup not checked"
    assert warning in run.stdout


def test_slurm_conf_path_from_environment(node: FakeNode) -> None:
    elsewhere = node.base / "slurm-25.11" / "slurm.conf"
    elsewhere.parent.mkdir()
    elsewhere.write_text(SLURM_CONF + PLUGIN + "\n")

    run = node.run(CONTROLLER_IP, LIFECYCLE_SLURM_CONF=str(elsewhere))

    assert f"ERROR in step slurm-topology: {elsewhere}:6 enables topology" in run.stderr
