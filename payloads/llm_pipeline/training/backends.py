"""Which engine a run trains with: train.backend, with auto resolved on the node that runs it.

auto is the neuron engine (optimum-neuron) on trn1's torch-xla runtime, else the torch engine (CUDA,
Trainium2's native ``neuron`` device, the CPU). The controller, which sees no device, resolves auto from
the partition's facts instead (jobs/partitions.backend_on).
"""

from __future__ import annotations

import glob
import importlib.util

from llm_pipeline.errors import StepError
from llm_pipeline.training import device


def neuron_available() -> bool:
    """The trn1 lane's runtime: Neuron devices, or torch-neuronx, with torch-xla (optimum-neuron's engine).
    TorchNeuron (trn2) installs torch-neuronx without torch-xla: the torch engine trains there."""
    if importlib.util.find_spec("torch_xla") is None:
        return False
    return bool(glob.glob("/dev/neuron[0-9]*")) or importlib.util.find_spec("torch_neuronx") is not None


def resolve_backend(name: str, *, kind: str | None = None) -> str:
    """train.backend with auto resolved; the neuron engine refused on TorchNeuron's native device
    (``kind``: torch's accelerator, for tests)."""
    if name == "auto":
        return "neuron" if neuron_available() else "torch"
    if name == "neuron" and (device.accelerator_type() if kind is None else kind) == device.NEURON:
        raise StepError(
            "train.backend = 'neuron' is optimum-neuron on trn1's torch-xla runtime; this host runs Trainium2's "
            "native neuron device (TorchNeuron): set train.backend = 'torch' or 'auto' (the trn2 lane, "
            "configs/llama3-8b-lora-trn2.toml)"
        )
    return name
