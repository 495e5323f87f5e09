"""Which device the torch engine trains on, and what that device asks of a run.

torch's accelerator API names the device: CUDA on a GPU, ``neuron`` where torch-neuronx's native
runtime (TorchNeuron, Trainium2) is installed and sees its devices, otherwise none (the CPU). The
Trainer picks the same device by itself once it is not told ``use_cpu`` (transformers 5's
TrainingArguments, accelerate's ``neuron`` process group, tests/payloads/test_trn2_contract.py).

The two Neuron lanes differ by runtime, not by device files: the trn1 lane runs optimum-neuron on
torch-xla (``/dev/neuron*`` plus torch_xla), the trn2 lane runs the torch engine on the native
``neuron`` device (torch-neuronx without torch_xla). Neuron compiles one graph per input shape, so
on ``neuron`` every batch is padded to data.max_length and a short last batch is dropped.
"""

from __future__ import annotations

from llm_pipeline import refusals

CPU, CUDA, NEURON = "cpu", "cuda", "neuron"


def accelerator_type() -> str:
    """The device type torch's accelerator API reports (cuda, neuron, ...), or cpu where there is none."""
    import torch

    if not torch.accelerator.is_available():
        return CPU
    return torch.accelerator.current_accelerator().type


def trainer_device_arguments(kind: str) -> dict[str, bool]:
    """TrainingArguments for the device: only a CPU run says so (transformers refuses bf16 without an
    accelerator unless told the CPU is meant); elsewhere the Trainer takes the accelerator."""
    return {"use_cpu": True} if kind == CPU else {}


def shape_arguments(max_length: int, kind: str) -> dict[str, int | bool]:
    """SFTConfig arguments that keep every batch one shape on ``neuron`` (a new shape is a new compile):
    rows padded to data.max_length (trl truncates to it, so each row is exactly that long) and no short
    last batch. Elsewhere nothing: padding to the longest row in the batch is cheaper."""
    if kind != NEURON:
        return {}
    return {"pad_to_multiple_of": max_length, "dataloader_drop_last": True}


def refused_levers(cfg, kind: str) -> list[str]:
    """One line per run-config setting the device cannot run (empty where it can), its own refusals first."""
    own = refusals.refused(cfg, refusals.NOT_TRN2, refusals.CUDA) if kind == NEURON else []
    lines = [f"{e.key} = {e.value!r} cannot run on the neuron device (TorchNeuron): {e.why}" for e in own]
    cuda_only = refusals.refused(cfg, refusals.CUDA) if kind != CUDA else []
    return lines + [f"{e.key} = {e.value!r} needs a CUDA GPU and this runtime has none: {e.why}" for e in cuda_only]
