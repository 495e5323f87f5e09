"""Training-job instance types: which SageMaker accepts, what each carries (stacks/accelerators.py,
the table the cluster uses too), and whether the run config can train there. Checked before
anything is uploaded or created."""

from __future__ import annotations

from functools import cache

import botocore
import botocore.session

from hpctl.common.errors import HpctlError
from llm_pipeline import config as run_config
from llm_pipeline import refusals
from stacks.accelerators import (
    CLUSTER_ONLY_FAMILIES,
    CUDA,
    CUDA_IMAGE_MIN_CAPABILITY,
    JOB_INSTANCE_TYPES,
    NEURON,
    InstanceFacts,
)

BACKEND_FOR = {"neuron": "neuron", "cuda": "torch", "cpu": "torch"}
DEVICE_NAMES = {NEURON: "NeuronCores", CUDA: "GPUs"}


@cache
def training_instance_types() -> tuple[str, ...]:
    """Every instance type CreateTrainingJob accepts, from botocore's SageMaker service model."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("TrainingInstanceType").enum)


def training_shape_limit(shape: str) -> int:
    """The largest value botocore's SageMaker model allows for a numeric shape."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    return int(model.shape_for(shape).metadata["max"])


def job_instance_facts(instance_type: str) -> InstanceFacts:
    """The accelerator table's row for a type check_instance_type accepted."""
    return JOB_INSTANCE_TYPES[instance_type]


def accelerator(instance_type: str) -> str:
    """neuron, cuda or cpu: which training image the type runs (a CPU type runs the CUDA image's torch)."""
    kind = job_instance_facts(instance_type).accelerator
    return kind if kind in (NEURON, CUDA) else "cpu"


def check_instance_type(instance_type: str, *, key: str) -> None:
    if instance_type not in training_instance_types():
        family = instance_type.rsplit(".", 1)[0]
        near = [name for name in training_instance_types() if name.startswith(family + ".")]
        hint = (
            f"this family offers {', '.join(near)}" if near else "e.g. ml.trn1.32xlarge, ml.p5.48xlarge, ml.g5.xlarge"
        )
        raise HpctlError(
            f"{key}: {instance_type!r} is not a SageMaker training instance type "
            f"(botocore {botocore.__version__}'s TrainingInstanceType); {hint}"
        )
    if instance_type not in JOB_INSTANCE_TYPES:
        family = instance_type.split(".")[1] if instance_type.count(".") == 2 else instance_type
        near = [name for name in JOB_INSTANCE_TYPES if name.split(".")[1] == family]
        hint = f"of this family it knows {', '.join(near)}" if near else "e.g. ml.trn1.32xlarge, ml.p5.48xlarge"
        raise HpctlError(
            f"{key}: {instance_type} has no row in stacks/accelerators.py, so its devices and network are "
            f"unknown ({hint}): pick a listed type, or add its row (accelerator, devices, EFA interfaces) there"
        )


def check_job_lane_runs(instance_type: str, *, key: str) -> None:
    """A type whose image the jobs lane does not build (Trainium2's TorchNeuron) stops here, naming the lane
    that runs it, before the run config's backend is judged against the trn1 image."""
    facts = JOB_INSTANCE_TYPES[instance_type]
    if facts.image_family in CLUSTER_ONLY_FAMILIES:
        raise HpctlError(
            f"{key}: {instance_type} ({facts.device_model}) runs the {facts.image_family} image, which SageMaker "
            "training jobs do not run yet: submit this run on the cluster lane (hpctl submit --config <run config>, "
            "a cluster with a Trainium2 compute group; docs/trainium2.md), or pick a trn1, GPU or CPU instance type"
        )


def check_devices(cfg: run_config.RunConfig, instance_type: str) -> None:
    """parallel.devices_per_node is what the instance carries; its GPUs can run the CUDA image."""
    facts = job_instance_facts(instance_type)
    wanted = cfg.parallel.devices_per_node
    if facts.accelerated and wanted != facts.devices:
        devices = DEVICE_NAMES[facts.accelerator]
        raise HpctlError(
            f"parallel.devices_per_node = {wanted}, but {instance_type} has {facts.devices} {devices} "
            f"({facts.device_model}): set parallel.devices_per_node = {facts.devices} (and fit tensor/pipeline "
            f"parallel to it), or pick an instance type with {wanted} {devices}"
        )
    if facts.accelerator == CUDA and not facts.meets_cuda_capability(CUDA_IMAGE_MIN_CAPABILITY):
        have = ".".join(map(str, facts.cuda_capability))
        need = ".".join(map(str, CUDA_IMAGE_MIN_CAPABILITY))
        raise HpctlError(
            f"{instance_type}'s {facts.device_model} GPUs (compute capability {have}) cannot run the CUDA training "
            f"image (CUDA 13, payloads/Dockerfile.cuda), which needs {need} or newer: pick ml.g5, ml.g6, ml.p4d "
            "or ml.p5"
        )


def check_run_fits(cfg: run_config.RunConfig, instance_type: str) -> str:
    """The train backend the job will use on this instance type; an error when the run cannot train there."""
    kind = accelerator(instance_type)
    backend = BACKEND_FOR[kind]
    if cfg.train.backend not in ("auto", backend):
        raise HpctlError(
            f"train.backend = {cfg.train.backend!r} cannot run on {instance_type} ({kind} instance, "
            f"{backend} backend): set train.backend to {backend!r} or 'auto', or pick "
            f"{'a trn1/trn2' if cfg.train.backend == 'neuron' else 'a GPU or CPU'} instance type"
        )
    try:
        run_config.check_backend(cfg, backend)
    except run_config.ConfigError as error:
        raise HpctlError(f"{error} (instance type {instance_type})") from None
    check_devices(cfg, instance_type)
    if kind != "cuda":  # off CUDA: no CUDA kernels, and the image lacks the CUDA image's packages
        for entry in refusals.REFUSALS:
            if (refusals.CUDA in entry.needs or entry.package) and entry.applies(cfg):
                raise HpctlError(
                    f"{entry.key} = {entry.value!r} cannot run on {instance_type} ({kind} instance): {entry.why}; "
                    "pick a GPU instance type (ml.g5, ml.p4d, ml.p5) or change the setting"
                )
    return backend
