"""A GPU node of a mixed cluster: its own partition's facts, nvidia-smi and the EFA count checked,
and every failed diagnostic logged without stopping provisioning."""

from __future__ import annotations

import json
import subprocess

from lifecycle_node import FACTS, GPU_IPS, FakeNode, expected_profile

PROFILE = "etc/profile.d/hyperpod-lora.sh"


def profile_environment(node: FakeNode) -> dict[str, str]:
    shell = subprocess.run(
        ["env", "-i", "bash", "-c", f"source {node.root / PROFILE} && env"], capture_output=True, text=True, check=True
    )
    return dict(line.split("=", 1) for line in shell.stdout.splitlines() if line.startswith("HPL_"))


def test_gpu_node_gets_its_partition_facts_and_passes_its_checks(gpu_node: FakeNode) -> None:
    run = gpu_node.run(GPU_IPS[1])

    assert run.returncode == 0, run.stderr
    assert "instance gpu-2, group gpu, role Compute" in run.stdout
    env = profile_environment(gpu_node)
    assert env == expected_profile("gpu")
    assert (env["HPL_PARTITION"], env["HPL_ACCELERATOR"], env["HPL_DEVICES_PER_NODE"]) == ("p5", "cuda", "8")
    assert env["HPL_IMAGE_URI"].endswith(":cuda456") and env["HPL_EFA_INTERFACES"] == "32"
    assert env["HPL_CAPACITY"] == "spot"
    installed = json.loads((gpu_node.root / "etc/hyperpod-lora/cluster-facts.json").read_text())
    assert installed == FACTS  # every partition, for submit
    assert run.called("nvidia-smi") == ["nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader"]
    assert "nvidia-smi: 7, NVIDIA H100 80GB HBM3, 81559 MiB" in run.stdout
    assert "8 GPUs, as ml.p5.48xlarge has" in run.stdout
    assert "32 EFA devices, as ml.p5.48xlarge has" in run.stdout
    assert "WARNING" not in run.stdout
    assert not run.called("neuron-ls") and not run.called("enroot")  # Neuron checks are for Trainium nodes


def test_trainium_node_of_the_same_cluster_keeps_its_own_facts(gpu_node: FakeNode) -> None:
    gpu_node.add_neuron_devices()
    run = gpu_node.run("10.1.1.1")

    assert run.returncode == 0, run.stderr
    env = profile_environment(gpu_node)
    assert (env["HPL_PARTITION"], env["HPL_ACCELERATOR"], env["HPL_DEVICES_PER_NODE"]) == ("trn1", "neuron", "32")
    assert not run.called("nvidia-smi")
    assert "WARNING: 32 EFA devices under /sys/class/infiniband, ml.trn1.32xlarge has 8" in run.stdout


def test_failing_nvidia_smi_is_logged_and_provisioning_continues(gpu_node: FakeNode) -> None:
    run = gpu_node.run(GPU_IPS[0], FAKE_NVIDIA_SMI_EXIT="9")

    assert run.returncode == 0, run.stderr
    assert "[gpu-devices] WARNING: nvidia-smi failed (exit 9): NVIDIA-SMI has failed" in run.stdout
    assert "node gpu-1 (Compute) is ready" in run.stdout


def test_missing_gpus_and_efa_devices_are_warnings(node: FakeNode) -> None:
    node.add_efa_devices(2)
    run = node.run(GPU_IPS[0], FAKE_GPUS="6")

    assert run.returncode == 0, run.stderr
    assert "WARNING: 6 GPUs visible, ml.p5.48xlarge has 8" in run.stdout
    assert "WARNING: 2 EFA devices under /sys/class/infiniband, ml.p5.48xlarge has 32" in run.stdout


def test_node_without_nvidia_smi_is_a_warning(gpu_node: FakeNode) -> None:
    gpu_node.remove_recorder("nvidia-smi")
    run = gpu_node.run(GPU_IPS[0])

    assert run.returncode == 0, run.stderr
    assert "WARNING: nvidia-smi not found on this ml.p5.48xlarge node" in run.stdout
