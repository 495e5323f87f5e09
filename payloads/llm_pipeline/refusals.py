"""What a run-config setting needs to run, and why: the one table of device and backend refusals.

Each entry is a key and value, what it needs, and the reason (with what to do instead), written once. Each
caller filters the table by what it knows and words the line for its place:
- config.check_backend (the controller, the steps): the neuron backend refuses what needs ``NOT_TRN1``;
- training/device.refused_levers (the torch engine, by torch's device): the TorchNeuron device refuses what
  needs ``NOT_TRN2`` or ``CUDA``, every other non-CUDA device what needs ``CUDA``;
- training/torch/backend.check_lever_packages: a setting whose ``package`` this runtime lacks;
- hpctl job (a SageMaker instance type): the torch backend off a CUDA instance refuses what needs ``CUDA`` or a
  ``package`` (the CUDA image carries them).

Stdlib only: the controller's python3 and hpctl import it.
"""

from __future__ import annotations

from dataclasses import dataclass

CUDA = "a CUDA GPU"  # the torch engine runs it on CUDA only
NOT_TRN1 = "not the neuron backend"  # optimum-neuron on trn1's torch-xla runtime refuses it
NOT_TRN2 = "not the neuron device"  # the torch engine on TorchNeuron (trn2) refuses it


@dataclass(frozen=True)
class Refusal:
    key: str  # section.key of the run config
    value: object
    needs: frozenset[str]  # CUDA, NOT_TRN1, NOT_TRN2
    why: str  # the reason, and what to do instead
    package: tuple[str, str] | None = None  # (module, pip name) the torch engine imports for it

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    def applies(self, cfg) -> bool:
        """Whether the run config (a RunConfig) sets this value."""
        return getattr(getattr(cfg, self.section), self.name) == self.value


REFUSALS = (
    Refusal(
        "train.objective",
        "dpo",
        frozenset({NOT_TRN1}),
        "optimum-neuron 0.4.5 trains SFT only; run DPO with the torch backend (GPU, or trn2's neuron device)",
    ),
    Refusal(
        "train.method",
        "dora",
        frozenset({NOT_TRN1}),
        "DoRA needs peft's weight-decomposed layers, which optimum-neuron does not shard; use method lora, or the "
        "torch backend",
    ),
    Refusal(
        "train.method",
        "qlora",
        frozenset({NOT_TRN1, NOT_TRN2}),
        "4-bit NF4 bases need bitsandbytes, which the CUDA image carries and Neuron cannot run; use method lora, "
        "or a GPU",
        ("bitsandbytes", "bitsandbytes"),
    ),
    Refusal(
        "train.objective",
        "grpo",
        frozenset({NOT_TRN1, NOT_TRN2}),
        "GRPO samples from a vLLM server that loads the policy's LoRA adapter at runtime (CPU and CUDA); use a GPU",
    ),
    Refusal("train.compile", True, frozenset({NOT_TRN1}), "neuronx-cc already compiles every graph; set it to false"),
    Refusal(
        "train.liger_kernel",
        True,
        frozenset({CUDA, NOT_TRN1}),
        "liger-kernel's kernels are Triton (CUDA) code; set it to false or auto",
        ("liger_kernel", "liger-kernel"),
    ),
    Refusal(
        "train.attention",
        "sdpa",
        frozenset({NOT_TRN1}),
        "optimum-neuron 0.4.5 refuses SDPA; use auto (the NKI flash kernel when data.max_length is a multiple of "
        "2048, else eager), flash_attention_2 or eager",
    ),
    Refusal(
        "train.attention",
        "flash_attention_2",
        frozenset({CUDA}),
        "flash-attn is CUDA code, which the CUDA image carries; use auto or sdpa",
        ("flash_attn", "flash-attn"),
    ),
    Refusal(
        "data.packing",
        True,
        frozenset({NOT_TRN1, NOT_TRN2}),
        "packed batches on Neuron: optimum-neuron 0.4.5's Llama ignores the attention mask (packed examples would "
        "attend to each other), and on TorchNeuron every new batch shape compiles; set data.packing = false (every "
        "example is padded to data.max_length, padding masked)",
    ),
)


def refused(cfg, *needs: str) -> list[Refusal]:
    """The entries the config sets that need any of ``needs`` (in table order)."""
    return [entry for entry in REFUSALS if entry.needs & set(needs) and entry.applies(cfg)]
