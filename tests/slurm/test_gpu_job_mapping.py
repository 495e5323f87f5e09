"""DCGM exporter's per-GPU job mapping (lifecycle/slurm_metrics.py gpu-jobs) with two jobs on one node: a local
Slurm with four GPUs as GRES (files standing in for the devices, with Slurm's own index bookkeeping), two jobs of
two GPUs each; each GPU's file names its own job. Where the AMI keeps its own mapping
(/run/slurm/dcgm-job-mapping, written by its prolog and epilog), that is what DCGM exporter gets."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import require_slurm
from tools.local_prometheus import SLURM_METRICS
from tools.local_slurm import LocalSlurm

GPUS = 4
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-gpu-jobs")]


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory):
    require_slurm()
    base = tmp_path_factory.mktemp("gpu-jobs")
    devices = base / "dev"
    devices.mkdir()
    for index in range(GPUS):
        (devices / f"nvidia{index}").touch()
    (base / "slurm").mkdir()
    (base / "slurm" / "gres.conf").write_text(f"Name=gpu File={devices}/nvidia[0-{GPUS - 1}]\n")
    with LocalSlurm(base / "slurm", extra_conf=("GresTypes=gpu",), node_conf=f"Gres=gpu:{GPUS}") as slurm:
        yield slurm, base


def mapping(slurm, folder: Path, *ami: Path) -> tuple[str, dict[str, list[str]]]:
    done = subprocess.run(
        [sys.executable, str(SLURM_METRICS), "gpu-jobs", str(folder), str(GPUS), slurm.node_names[0], *map(str, ami)],
        env=slurm.env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip(), {path.name: path.read_text().split() for path in sorted(folder.iterdir())}


def test_two_jobs_on_one_node_each_get_their_own_gpus(gpu_node, tmp_path):
    slurm, base = gpu_node
    job = ("sbatch", "--parsable", "--gres=gpu:2", "--mem=100", "-n1", f"--output={base}/job-%j.out")
    jobs = [slurm.run(*job, "--wrap", "sleep 60").stdout.strip() for _ in range(2)]
    deadline = time.monotonic() + 60
    while slurm.run("squeue", "-h", "-t", "RUNNING", "-o", "%A").stdout.split() != sorted(jobs, key=int):
        assert time.monotonic() < deadline, slurm.run("squeue").stdout
        time.sleep(0.5)
    first, second = jobs
    folder = tmp_path / "gpu-jobs"
    folder.mkdir()
    (folder / "3").write_text("999\n")  # a job that has ended: its GPU is free now

    source, files = mapping(slurm, folder, tmp_path / "no-ami-mapping")
    assert source == "GPU job mapping from slurm"
    assert files == {"0": [first], "1": [first], "2": [second], "3": [second]}

    slurm.run("scancel", first)
    deadline = time.monotonic() + 30
    while first in slurm.run("squeue", "-h", "-o", "%A").stdout.split():
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert mapping(slurm, folder, tmp_path / "no-ami-mapping")[1] == {"2": [second], "3": [second]}
    slurm.run("scancel", second)


def test_the_amis_own_mapping_wins_where_it_exists(gpu_node, tmp_path):
    slurm, _ = gpu_node
    ami = tmp_path / "dcgm-job-mapping"  # /run/slurm/dcgm-job-mapping on a HyperPod GPU node
    ami.mkdir()
    (ami / "0").write_text("41\n")
    (ami / "5").write_text("42\n43\n")
    folder = tmp_path / "gpu-jobs"
    folder.mkdir()
    (folder / "1").write_text("40\n")
    source, files = mapping(slurm, folder, ami)
    assert source == f"GPU job mapping from {ami}"
    assert files == {"0": ["41"], "5": ["42", "43"]}
