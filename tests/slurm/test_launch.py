"""torchrun launch arguments from the Slurm allocation, and a real 2-node gloo rendezvous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, wait_for

from llm_pipeline.jobs import launch
from llm_pipeline.run_files import StepMarker

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-launch")]


def slurm_env(nodes: int, nodelist: str, job_id: int = 4242, **extra: str) -> dict[str, str]:
    return {"SLURM_JOB_NUM_NODES": str(nodes), "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": str(job_id), **extra}


@pytest.mark.parametrize(
    ("nodes", "nodelist", "first"),
    [
        (1, "ip-10-1-7-20", "ip-10-1-7-20"),
        (2, "ip-10-1-7-[20-21]", "ip-10-1-7-20"),
        (4, "ip-10-1-7-[20,22],ip-10-1-9-[3-4]", "ip-10-1-7-20"),
    ],
)
def test_arguments_for_1_2_4_nodes(two_nodes, monkeypatch, nodes, nodelist, first):
    # Host lists are expanded by the real `scontrol show hostnames`; these hosts are not in the
    # local cluster, so the master address falls back to the first name, as Slurm names it.
    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))
    env = slurm_env(nodes, nodelist, HPL_DEVICES_PER_NODE="32")
    assert launch.torchrun_args(env) == [
        f"--nnodes={nodes}",
        "--nproc_per_node=32",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={first}:{launch.PORT_BASE + 4242}",
        "--rdzv_id=4242",
        "--max_restarts=0",
    ]


@pytest.mark.parametrize("job_id", [1, 4242, 12_767, 12_768, 31_999, 99_999, 2**31 - 1])
def test_default_rendezvous_port_stays_below_the_ephemeral_range(two_nodes, monkeypatch, job_id):
    """Linux hands out 32768-60999 to outgoing connections: a port there may already be taken."""
    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))
    endpoint = next(arg for arg in launch.torchrun_args(slurm_env(2, "node[1-2]", job_id)) if "rdzv_endpoint" in arg)
    port = int(endpoint.rsplit(":", 1)[1])
    assert 1024 < port < 32768


def test_master_is_the_first_node_address_and_port_override(two_nodes, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))
    args = launch.torchrun_args(slurm_env(2, "node[1-2]", HPL_MASTER_PORT="29501"))
    assert "--rdzv_endpoint=127.0.0.1:29501" in args  # node1's NodeAddr in the local slurm.conf
    assert "--nproc_per_node=1" in args  # no HPL_DEVICES_PER_NODE: one process per node


@pytest.mark.parametrize(
    "expression",
    [
        "node1",
        "ip-10-1-7-[20-21]",
        "ip-10-1-7-[20,22],ip-10-1-9-[3-4]",
        "n[01-03],m[8-11]",
        "rack[1-2]-n[09-10]",
        "b,a",
    ],
)
def test_host_lists_expand_exactly_as_scontrol_does(two_nodes, expression):
    """Expanded here because the srun'd command may run in a container without Slurm's commands."""
    real = subprocess.run(
        ["scontrol", "show", "hostnames", expression], env=two_nodes.env(), capture_output=True, text=True, check=True
    )
    assert launch.expand_hostlist(expression) == real.stdout.split()


@pytest.mark.parametrize("expression", ["n[1-", "n[3-1]", "n[a-b]", ""])
def test_bad_host_lists_are_named(expression):
    with pytest.raises(launch.LaunchError, match="host list"):
        launch.expand_hostlist(expression)


def test_a_step_uses_its_own_node_list():
    env = slurm_env(2, "node[1-2]", SLURM_STEP_NODELIST="node2", SLURM_STEP_NUM_NODES="1")
    args = launch.torchrun_args(env, node_address=str)
    assert args[0] == "--nnodes=1" and args[3].startswith("--rdzv_endpoint=node2:")


def test_ports_of_different_jobs_differ():
    def names(_: str) -> list[str]:
        return ["a"]

    ports = {launch.torchrun_args(slurm_env(1, "a", job), hostnames=names, node_address=str)[3] for job in (7, 8, 9)}
    assert len(ports) == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SLURM_JOB_NUM_NODES is not set"),
        (slurm_env(0, "a"), "SLURM_JOB_NUM_NODES='0' must be at least 1"),
        (slurm_env(3, "a"), "names 1 hosts but SLURM_JOB_NUM_NODES=3"),
        (slurm_env(1, "a", HPL_DEVICES_PER_NODE="many"), "HPL_DEVICES_PER_NODE='many' is not an integer"),
    ],
)
def test_bad_slurm_environment_is_named(env, message):
    with pytest.raises(launch.LaunchError, match=message.replace("[", r"\[")):
        launch.torchrun_args(env, hostnames=lambda _: ["a"], node_address=str)


def test_cli_outside_a_job_says_so():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(
        ["python3", "-m", "llm_pipeline.jobs.launch"],
        env={**env, "PYTHONPATH": str(REPO / "payloads")},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: SLURM_JOB_NUM_NODES is not set: run inside a Slurm job (sbatch/srun)"


def run_two_node_job(cluster, tmp_path: Path, script: str, timeout_s: float) -> Path:
    """Run tests/slurm/<script> on both nodes through env.sh (host runtime, 2 workers per node) and
    wait until it completes; returns the run folder the probes wrote into."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = cluster.env()
    env.update(
        HPL_PAYLOADS_DIR=str(REPO / "payloads"),
        HPL_RUN_CONFIG=str(tmp_path / "unused.toml"),
        HPL_RUN_DIR=str(run_dir),
        HPL_RUNTIME="host",
        HPL_DEVICES_PER_NODE="2",
        PYTHON=sys.executable,
        PYTHONPATH=str(Path(__file__).parent),
        HPL_FSX_MOUNT_PATH=str(tmp_path / "fsx"),
    )
    log = tmp_path / f"{Path(script).stem}.log"
    job = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", f"--output={log}", str(Path(__file__).with_name(script))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    marker = run_dir / "logs" / "state" / "probe.json"
    wait_for(
        lambda: marker.is_file() and StepMarker.from_json(marker.read_text()).state != "RUNNING",
        timeout_s,
        f"job {job}",
    )
    assert StepMarker.from_json(marker.read_text()).state == "COMPLETED", log.read_text()
    return run_dir


def test_two_node_gloo_rendezvous_through_env_sh(two_nodes, tmp_path):
    """Two slurmd on this host, one torchrun agent each, 2 workers per node: world size 4."""
    run_dir = run_two_node_job(two_nodes, tmp_path, "probe.sbatch", 180)

    seen = [json.loads((run_dir / f"probe-{rank}.json").read_text()) for rank in range(4)]
    assert {s["world"] for s in seen} == {4}
    assert {s["sum"] for s in seen} == {1.0 + 2 + 3 + 4}
    assert sorted(s["node"] for s in seen) == ["node1", "node1", "node2", "node2"]
    assert len({(s["node"], s["group_rank"]) for s in seen}) == 2  # one torchrun agent per node
    # env.sh's settings reach the workers; EFA is chosen because the job spans two nodes.
    settings = seen[0]["env"]
    assert settings["FI_PROVIDER"] == "efa" and settings["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert settings["FI_EFA_FORK_SAFE"] == "1"
    assert settings["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1"  # bf16 with stochastic rounding (trn1 reference)
    assert settings["HF_HUB_OFFLINE"] == "1"  # no step after download and data reaches the Hub
    assert settings["MALLOC_ARENA_MAX"] == "64"
    assert f"--cache_dir={tmp_path / 'fsx' / 'neuron-cache'}" in settings["NEURON_CC_FLAGS"]


def test_auto_resume_rerun_with_a_changed_node_list_meets_at_its_own_first_node(two_nodes, tmp_path):
    """The srun'd command computes the rendezvous itself: run once on node1+node2, then (same command,
    as auto-resume re-runs it after replacing node1) on node2 alone, it forms a 1-node world there.
    A command with the arguments baked in would wait for 2 nodes at node1 and never start."""
    run_dir = run_two_node_job(two_nodes, tmp_path, "relaunch.sbatch", 240)

    first = [json.loads(p.read_text()) for p in sorted((run_dir / "first").glob("probe-*.json"))]
    second = [json.loads(p.read_text()) for p in sorted((run_dir / "second").glob("probe-*.json"))]
    assert len(first) == 4 and {s["world"] for s in first} == {4}
    assert sorted(s["node"] for s in first) == ["node1", "node1", "node2", "node2"]
    assert len(second) == 2 and {s["world"] for s in second} == {2} and {s["node"] for s in second} == {"node2"}
    launches = [
        line for line in (tmp_path / "relaunch.log").read_text().splitlines() if "torch.distributed.run" in line
    ]
    assert len(launches) == 3  # one agent per node in the first run, one in the second
    assert "[node2]" in launches[-1] and "--nnodes=1" in launches[-1]
    assert all("--nnodes=2" in line for line in launches[:2])
