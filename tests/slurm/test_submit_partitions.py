"""The run's partition: chosen from the run config or the engine, its facts (accelerator, devices per
node, EFA) exported to every job, and env.sh's communication settings taken from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO

from llm_pipeline.errors import StepError
from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE
from llm_pipeline.jobs.partitions import check_devices_per_node, choose_partition, partition_environment

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-submit_partitions")]
TRN1 = {"accelerator": "neuron", "devices_per_node": 32, "efa_interfaces": 8, "efa_device_rdma": 1, "fp8": 0}
P5 = {"accelerator": "cuda", "devices_per_node": 8, "efa_interfaces": 32, "efa_device_rdma": 1, "fp8": 1}
G5 = {"accelerator": "cuda", "devices_per_node": 4, "efa_interfaces": 1, "efa_device_rdma": 0, "fp8": 0}
CPU = {"accelerator": "none", "devices_per_node": 0, "efa_interfaces": 0, "efa_device_rdma": 0, "fp8": 0}
MIXED = {"trn1": TRN1, "p5": P5, "cpu": CPU}
ENV_SH = REPO / "payloads" / "slurm" / "env.sh"


@pytest.mark.parametrize(
    ("kwargs", "chosen"),
    [
        ({}, "trn1"),  # the default
        ({"fallback": "p5"}, "p5"),  # the submitting node's own partition
        ({"fallback": "removed"}, "trn1"),  # a partition no longer deployed: the default
        ({"accelerator": "cuda"}, "p5"),  # train.backend = torch
        ({"accelerator": "neuron", "required": True, "fallback": "p5"}, "trn1"),  # the engine wins over the node
        ({"requested": "cpu", "accelerator": "cuda"}, "cpu"),  # the run config wins over everything
    ],
)
def test_choose_partition(kwargs, chosen):
    assert choose_partition(MIXED, default="trn1", **kwargs) == chosen


def test_choose_partition_errors_name_the_key_and_the_partitions():
    with pytest.raises(
        StepError, match=r"parallel.partition = 'h100' is not a partition.*trn1 \(neuron\), p5 \(cuda\)"
    ):
        choose_partition(MIXED, requested="h100", default="trn1")
    with pytest.raises(StepError, match=r"needs a neuron partition \(train.backend\).*add a compute group"):
        choose_partition({"p5": P5}, accelerator="neuron", required=True, default="p5")
    # The torch backend also runs on CPU: without a GPU partition it takes the default one.
    assert choose_partition({"trn1": TRN1}, accelerator="cuda", default="trn1") == "trn1"


def test_partition_environment_and_devices_check():
    assert partition_environment("p5", P5) == {
        "HPL_PARTITION": "p5",
        "HPL_ACCELERATOR": "cuda",
        "HPL_DEVICES_PER_NODE": "8",
        "HPL_EFA_INTERFACES": "32",
        "HPL_EFA_DEVICE_RDMA": "1",
        "HPL_IMAGE_FAMILY": "cuda",  # a deploy's facts without image_family: the accelerator's image
    }
    assert partition_environment("cpu", CPU)["HPL_DEVICES_PER_NODE"] == "1"  # one process on a CPU node
    check_devices_per_node("p5", P5, None)  # not set in the run config: the partition decides
    check_devices_per_node("p5", P5, 8)
    check_devices_per_node("cpu", CPU, 32)
    with pytest.raises(
        StepError, match=r"parallel.devices_per_node = 32, but partition p5 .* set parallel.devices_per_node = 8"
    ):
        check_devices_per_node("p5", P5, 32)


@pytest.fixture
def fsx(tmp_path: Path) -> Path:
    """/fsx/payloads as FSx imports it, with the deploy facts of a trn1 + p5 + g5 cluster."""
    payloads = tmp_path / "fsx" / "payloads"
    for folder in ("llm_pipeline", "slurm"):
        shutil.copytree(REPO / "payloads" / folder, payloads / folder, ignore=shutil.ignore_patterns("__pycache__"))
    partitions = {"trn1": TRN1, "p5": P5, "g5": G5}
    facts = {
        "runtime": "pyxis",
        "default_partition": "trn1",
        "partition_images": {name: f"repo:{name}" for name in partitions},
        "partitions": partitions,
    }
    (payloads / DEPLOY_FACTS_FILE).write_text(json.dumps(facts))
    return tmp_path / "fsx"


def dry_run(fsx: Path, run_config: str, *args: str) -> subprocess.CompletedProcess[str]:
    """submit --dry-run from the FSx copy on a stdlib-only Python, as on the controller."""
    config = fsx / "payloads" / "run.toml"
    config.write_text(f"[paths]\noutput_dir = '{fsx}/outputs/run'\n{run_config}")
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(fsx / 'payloads')!r}); sys.argv = ['submit', *sys.argv[1:]]; "
        "runpy.run_module('llm_pipeline.submit', run_name='__main__')"
    )
    env = {**os.environ, "HPL_FSX_MOUNT_PATH": str(fsx), "HPL_PARTITION": "trn1"}  # the controller's profile
    return subprocess.run(
        [sys.executable, "-S", "-c", code, *args, "--config", str(config), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
    )


@pytest.mark.parametrize(
    ("run_config", "partition", "devices", "image"),
    [
        ("", "trn1", "32", "repo:trn1"),
        ("[train]\nbackend = 'torch'\n[parallel]\ndevices_per_node = 8\n", "p5", "8", "repo:p5"),
        # TP 1: the base config's TP 8 cannot divide g5's 4 devices (the controller validates the whole RunConfig)
        (
            "[parallel]\npartition = 'g5'\ndevices_per_node = 4\ntensor_parallel_size = 1\n"
            "[train]\nbackend = 'torch'\n",
            "g5",
            "4",
            "repo:g5",
        ),
    ],
    ids=["default", "engine-picks-gpu", "run-config-names-it"],
)
def test_every_job_goes_to_the_partition_with_its_facts(fsx, run_config, partition, devices, image):
    out = dry_run(fsx, run_config)
    assert out.returncode == 0, out.stderr
    jobs = [line for line in out.stdout.splitlines() if "sbatch" in line]
    assert jobs
    for line in jobs:
        assert f"--partition={partition}" in line
        assert f"HPL_PARTITION={partition}," in line and f"HPL_DEVICES_PER_NODE={devices}," in line
        assert f"HPL_IMAGE_URI={image}" in line


def test_a_mismatched_run_config_stops_submit_naming_the_key(fsx):
    out = dry_run(fsx, "[train]\nbackend = 'torch'\n")  # devices_per_node unset: the partition's 8 apply
    assert out.returncode == 0, out.stderr
    out = dry_run(fsx, "[train]\nbackend = 'torch'\n[parallel]\ndevices_per_node = 32\n")
    assert out.returncode == 2
    assert "parallel.devices_per_node = 32, but partition p5 (cuda) has 8 devices per node" in out.stderr
    out = dry_run(fsx, "[parallel]\npartition = 'h100'\n")
    assert out.returncode == 2 and "parallel.partition = 'h100' is not a partition of this cluster" in out.stderr


def env_sh(tmp_path: Path, **env: str) -> dict[str, str]:
    """The environment a step sees after `source env.sh`, given the partition facts submit exported."""
    out = after_env_sh(tmp_path, "probe", "env", **env)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def after_env_sh(tmp_path: Path, step: str, command: str, **env: str) -> str:
    """What ``command`` prints after `source env.sh <step>`, given the partition facts submit exported."""
    script = f"source {ENV_SH} {step} >/dev/null && {command}"
    base = {
        "PATH": os.environ["PATH"],
        "HPL_PAYLOADS_DIR": str(REPO / "payloads"),
        "HPL_RUN_CONFIG": str(tmp_path / "run.toml"),
        "HPL_RUN_DIR": str(tmp_path / "run"),
        "HPL_FSX_MOUNT_PATH": str(tmp_path / "fsx"),
    }
    out = subprocess.run(["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, check=True)
    return out.stdout


COMMUNICATION = (
    "FI_PROVIDER",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_USE_HUGE_PAGE",
    "NCCL_SOCKET_IFNAME",
    "NEURON_CC_FLAGS",
)


def test_gpu_partition_gets_nccl_over_efa(tmp_path):
    env = env_sh(
        tmp_path, HPL_ACCELERATOR="cuda", HPL_EFA_INTERFACES="32", HPL_EFA_DEVICE_RDMA="1", SLURM_JOB_NUM_NODES="4"
    )
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert (env["FI_EFA_USE_HUGE_PAGE"], env["FI_EFA_SET_CUDA_SYNC_MEMOPS"]) == ("0", "0")
    assert env["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"
    assert "NEURON_CC_FLAGS" not in env


def test_g5_gets_efa_without_device_rdma_and_one_node_no_efa(tmp_path):
    g5 = env_sh(
        tmp_path, HPL_ACCELERATOR="cuda", HPL_EFA_INTERFACES="1", HPL_EFA_DEVICE_RDMA="0", SLURM_JOB_NUM_NODES="2"
    )
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    single = env_sh(tmp_path, HPL_ACCELERATOR="cuda", HPL_EFA_INTERFACES="32", SLURM_JOB_NUM_NODES="1")
    assert "FI_PROVIDER" not in single and single["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"


def test_trainium_partition_keeps_neuron_settings_and_efa_rdma(tmp_path):
    env = env_sh(
        tmp_path, HPL_ACCELERATOR="neuron", HPL_EFA_INTERFACES="8", HPL_EFA_DEVICE_RDMA="1", SLURM_JOB_NUM_NODES="2"
    )
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert "--cache_dir=" in env["NEURON_CC_FLAGS"] and "NCCL_SOCKET_IFNAME" not in env


def test_cpu_partition_and_user_overrides(tmp_path):
    cpu = env_sh(tmp_path, HPL_ACCELERATOR="none", HPL_EFA_INTERFACES="0", SLURM_JOB_NUM_NODES="2")
    assert not {name for name in COMMUNICATION if name in cpu}
    mine = env_sh(
        tmp_path, HPL_ACCELERATOR="cuda", SLURM_JOB_NUM_NODES="2", FI_PROVIDER="tcp", NCCL_SOCKET_IFNAME="ens5"
    )
    assert (mine["FI_PROVIDER"], mine["NCCL_SOCKET_IFNAME"]) == ("tcp", "ens5")


def test_unknown_accelerator_stops_the_step(tmp_path):
    out = subprocess.run(
        ["bash", "-c", f"source {ENV_SH} probe"],
        env={
            "PATH": os.environ["PATH"],
            "HPL_PAYLOADS_DIR": str(REPO / "payloads"),
            "HPL_RUN_CONFIG": "x",
            "HPL_RUN_DIR": str(tmp_path),
            "HPL_ACCELERATOR": "tpu",
        },
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "HPL_ACCELERATOR=tpu is not an accelerator" in out.stderr


def test_fp8_ladder_prefers_a_partition_with_fp8_gpus():
    gpus = {"g5": G5, "p5": P5}
    assert choose_partition(gpus, accelerator="cuda", required=True, default="g5", fp8=True) == "p5"
    assert choose_partition(gpus, accelerator="cuda", required=True, default="g5") == "g5"


def test_ladder_refuses_fp8_rungs_on_a_partition_without_fp8_gpus(fsx):
    out = dry_run(fsx, "[parallel]\npartition = 'g5'\n", "ladder")
    assert out.returncode == 2
    assert (
        "ladder rung fp8, fp8_allgather needs FP8 GPUs (compute capability 8.9 or newer: L4, L40S, H100, H200, B200) "
        'and partition g5 (cuda) has none: set torchtitan.rungs = ["baseline", "compile"] to run the others there'
    ) in out.stderr
    out = dry_run(fsx, '[parallel]\npartition = \'g5\'\n[torchtitan]\nrungs = ["baseline", "compile"]\n', "ladder")
    assert out.returncode == 0, out.stderr
    assert all("--partition=g5" in line for line in out.stdout.splitlines() if "sbatch" in line)
    out = dry_run(fsx, "", "ladder")  # no partition named: the first one with FP8 GPUs
    assert out.returncode == 0, out.stderr
    assert all("--partition=p5" in line for line in out.stdout.splitlines() if "sbatch" in line)


def test_the_rowwise_rung_needs_fp8_gpus_too(fsx):
    out = dry_run(fsx, '[parallel]\npartition = \'g5\'\n[torchtitan]\nrungs = ["baseline", "fp8_rowwise"]\n', "ladder")
    assert out.returncode == 2 and "ladder rung fp8_rowwise needs FP8 GPUs" in out.stderr


def test_trainium2_partition_gets_the_torchneuron_cache_and_no_xla_settings(tmp_path):
    env = env_sh(tmp_path, HPL_ACCELERATOR="neuron", HPL_IMAGE_FAMILY="torchneuron", HPL_EFA_INTERFACES="16")
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == f"{tmp_path}/fsx/neuron-cache/torchneuron"  # FSx: every run's
    assert "NEURON_CC_FLAGS" not in env and "NEURON_RT_STOCHASTIC_ROUNDING_EN" not in env
    trn1 = env_sh(tmp_path, HPL_ACCELERATOR="neuron", HPL_EFA_INTERFACES="8")
    assert "--cache_dir=" in trn1["NEURON_CC_FLAGS"] and "TORCH_NEURONX_NEFF_CACHE_DIR" not in trn1


@pytest.mark.parametrize(("family", "wrap"), [("torchneuron", ""), ("neuron", "--wrap neuron_parallel_compile")])
def test_precompile_wraps_in_the_xla_tool_only_on_trn1(tmp_path, family, wrap):
    out = after_env_sh(tmp_path, "precompile", 'echo "wrap=$(hpl_precompile_wrap)"', HPL_IMAGE_FAMILY=family)
    assert [line for line in out.splitlines() if line.startswith("wrap=")] == [f"wrap={wrap}"]
