"""Which Slurm partition a run goes to, and what its jobs learn about it (stdlib only, Python 3.10).

Each compute group of the cluster is one partition; the deploy writes every partition's facts
(accelerator, devices per node, EFA interfaces, image) next to the payloads (deploy-facts.json).
submit picks the partition: the run config's ``parallel.partition`` when set, else the first
partition whose accelerator the engine needs (``train.backend`` neuron -> a Trainium partition,
torch -> a GPU one if there is one; the pretraining ladder -> a GPU one), else the submitting node's own
(HPL_PARTITION, when it is still deployed) or the cluster's default. The chosen partition's facts
reach every job as HPL_* variables, which slurm/env.sh turns into the communication settings and
jobs/launch.py into processes per node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from llm_pipeline.config import FP8_RUNGS
from llm_pipeline.errors import StepError

NEURON, CUDA, NO_ACCELERATOR = "neuron", "cuda", "none"
ACCELERATOR_OF_BACKEND = {"neuron": NEURON, "torch": CUDA}


def backend_on(backend: str, env: Mapping[str, str]) -> str:
    """train.backend as the chosen partition's nodes resolve it (training/backends.resolve_backend there),
    from its HPL_* facts: auto is neuron on a Trainium partition with trn1's image (optimum-neuron on
    torch-xla), else torch (Trainium2's TorchNeuron image, a GPU, a CPU)."""
    if backend != "auto":
        return backend
    trn1 = env.get("HPL_ACCELERATOR") == NEURON and env.get("HPL_IMAGE_FAMILY", NEURON) == NEURON
    return "neuron" if trn1 else "torch"


# The neuron backend and torchtitan cannot run anywhere else; the torch backend also runs on CPU,
# so without a GPU partition it goes to the default one (the rehearsal config on a Trainium cluster).
REQUIRED = (NEURON,)
# What a partition's facts hold (deploy-facts.json "partitions"), and the variable each becomes.
FACT_ENV = {
    "accelerator": "HPL_ACCELERATOR",
    "devices_per_node": "HPL_DEVICES_PER_NODE",
    "efa_interfaces": "HPL_EFA_INTERFACES",
    "efa_device_rdma": "HPL_EFA_DEVICE_RDMA",
}
# Facts a deploy before Trainium2 did not write: the variable, and the value when the fact is absent.
# image_family: torchneuron on Trainium2 (the native runtime; slurm/accelerator_env.sh, precompile.sbatch),
# else the accelerator. peak_tflops: one rank's dense bf16 peak for MFU where the payload's table lacks it.
# host_memory_gib: the node's memory, for prepare's check of a full fine-tuning load (training.full_rules).
# serving_image_uri: the partition's vLLM image under Pyxis (slurm/env.sh's hpl_vllm_srun; jobs/serving_image.py).
OPTIONAL_FACT_ENV = {
    "image_family": "HPL_IMAGE_FAMILY",
    "peak_tflops": "HPL_PEAK_TFLOPS",
    "host_memory_gib": "HPL_HOST_MEMORY_GIB",
    "serving_image_uri": "HPL_SERVING_IMAGE_URI",
}
ENV_NAMES = ("HPL_PARTITION", *FACT_ENV.values(), *OPTIONAL_FACT_ENV.values())


def choose_partition(
    partitions: Mapping[str, Mapping[str, object]],
    *,
    requested: str = "",
    accelerator: str = "",
    required: bool = False,
    fallback: str = "",
    default: str,
    fp8: bool = False,
) -> str:
    """The partition for a run; a StepError names the run config key and the partitions there are.
    With ``fp8`` (a ladder with FP8 rungs), a partition of ``accelerator`` with FP8 GPUs comes first."""
    known = ", ".join(f"{name} ({facts['accelerator']})" for name, facts in partitions.items())
    if requested:
        if requested not in partitions:
            raise StepError(
                f"run config parallel.partition = {requested!r} is not a partition of this cluster; "
                f"its partitions are {known}: name one of them, or leave the key empty"
            )
        return requested
    if accelerator:
        matching = [name for name, facts in partitions.items() if facts["accelerator"] == accelerator]
        for name in sorted(matching, key=lambda name: not (fp8 and int(partitions[name]["fp8"]))):
            return name
    if accelerator and required:
        raise StepError(
            f"the run needs a {accelerator} partition (train.backend) and the cluster has none ({known}): "
            "add a compute group with that accelerator (cdk.json compute_groups), or set parallel.partition"
        )
    return fallback if fallback in partitions else default


def partition_environment(name: str, facts: Mapping[str, object]) -> dict[str, str]:
    """HPL_* for every job on partition `name`. A CPU partition still runs one process per node."""
    env = {"HPL_PARTITION": name}
    for key, variable in FACT_ENV.items():
        env[variable] = str(facts[key])
    env["HPL_DEVICES_PER_NODE"] = str(max(1, int(facts["devices_per_node"])))
    env["HPL_IMAGE_FAMILY"] = str(facts.get("image_family") or facts["accelerator"])
    if float(facts.get("peak_tflops") or 0) > 0:
        env["HPL_PEAK_TFLOPS"] = str(facts["peak_tflops"])
    if int(facts.get("host_memory_gib") or 0) > 0:
        env["HPL_HOST_MEMORY_GIB"] = str(facts["host_memory_gib"])
    if facts.get("serving_image_uri"):
        env["HPL_SERVING_IMAGE_URI"] = str(facts["serving_image_uri"])
    return env


def check_fp8_rungs(name: str, facts: Mapping[str, object], rungs: Sequence[str]) -> None:
    """The ladder's FP8 rungs only on a partition whose GPUs have FP8 (the deploy's ``fp8`` fact:
    compute capability 8.9 or newer): elsewhere torchtitan's float8 converter refuses to start, after
    the rungs before it ran for hours."""
    fp8 = [rung for rung in rungs if rung in FP8_RUNGS]
    if not fp8 or int(facts["fp8"]):
        return
    others = [rung for rung in rungs if rung not in FP8_RUNGS]
    keep = f"set torchtitan.rungs = {json.dumps(others)} to run the others there, or " if others else ""
    raise StepError(
        f"ladder rung {', '.join(fp8)} needs FP8 GPUs (compute capability 8.9 or newer: L4, L40S, H100, H200, "
        f"B200) and partition {name} ({facts['accelerator']}) has none: {keep}set parallel.partition to a "
        "partition of such GPUs (ml.g6, ml.g6e, ml.p5, ml.p5e, ml.p5en, ml.p6-b200)"
    )


def check_devices_per_node(name: str, facts: Mapping[str, object], configured: int | None) -> None:
    """The run config's parallel.devices_per_node (when it sets one) must be what the partition has."""
    devices = int(facts["devices_per_node"])
    if configured is None or facts["accelerator"] == NO_ACCELERATOR or configured == devices:
        return
    raise StepError(
        f"run config parallel.devices_per_node = {configured}, but partition {name} "
        f"({facts['accelerator']}) has {devices} devices per node: set parallel.devices_per_node = {devices}"
    )
