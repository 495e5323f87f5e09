"""Training-job instance types: which SageMaker accepts, what accelerator each carries, and whether
the run config can train on it. Checked before anything is uploaded or created."""

from __future__ import annotations

from functools import cache

import botocore
import botocore.session

from hpctl.errors import HpctlError
from llm_pipeline import config as run_config

NEURON_FAMILIES = ("trn1", "trn1n", "trn2", "trn3", "inf2")
NON_CUDA_GPU_FAMILIES = ("g4ad",)  # AMD GPUs: no CUDA
# Logical NeuronCores per instance: processes per host (the same facts as stacks/config.py, which a
# test keeps equal). GPU hosts need no entry: the SDK's container driver counts their GPUs.
NEURON_CORES_PER_INSTANCE = {
    "ml.trn1.2xlarge": 2,
    "ml.trn1.32xlarge": 32,
    "ml.trn1n.32xlarge": 32,
    "ml.trn2.3xlarge": 4,
    "ml.trn2.48xlarge": 64,
}
BACKEND_FOR = {"neuron": "neuron", "cuda": "torch", "cpu": "torch"}
# What the torch backend can only do with CUDA (the neuron backend's own refusals live in config.py).
CUDA_ONLY = {
    ("method", "qlora"): "4-bit NF4 bases need bitsandbytes' CUDA kernels",
    ("liger_kernel", True): "liger-kernel is Triton (GPU) code",
    ("attention", "flash_attention_2"): "flash-attn runs on CUDA GPUs only",
}


@cache
def training_instance_types() -> tuple[str, ...]:
    """Every instance type CreateTrainingJob accepts, from botocore's SageMaker service model."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("TrainingInstanceType").enum)


def accelerator(instance_type: str) -> str:
    """neuron, cuda or cpu, from the instance family (ml.<family>.<size>)."""
    family = instance_type.split(".")[1] if instance_type.count(".") == 2 else ""
    if family in NEURON_FAMILIES:
        return "neuron"
    if family[:1] in ("p", "g") and family[1:2].isdigit() and family not in NON_CUDA_GPU_FAMILIES:
        return "cuda"
    return "cpu"


def check_instance_type(instance_type: str, *, key: str) -> None:
    if instance_type in training_instance_types():
        return
    family = instance_type.rsplit(".", 1)[0]
    near = [name for name in training_instance_types() if name.startswith(family + ".")]
    hint = f"this family offers {', '.join(near)}" if near else "e.g. ml.trn1.32xlarge, ml.p5.48xlarge, ml.g5.xlarge"
    raise HpctlError(
        f"{key}: {instance_type!r} is not a SageMaker training instance type "
        f"(botocore {botocore.__version__}'s TrainingInstanceType); {hint}"
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
    if kind != "cuda":
        for (name, value), reason in CUDA_ONLY.items():
            if getattr(cfg.train, name) == value:
                raise HpctlError(
                    f"train.{name} = {value!r} cannot run on {instance_type} ({kind} instance): {reason}; "
                    "pick a GPU instance type (ml.g5, ml.p4d, ml.p5) or change the setting"
                )
    return backend
