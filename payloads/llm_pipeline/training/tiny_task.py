"""A tiny task a device must learn, and the verdict on a device's run of it against the CPU's.

The task is a fixed cycle of tokens (each token has one successor), every row a rotation of it: a tiny
random Llama learns that map within a few steps (loss about 5.6 -> 1.1 in 20 AdamW steps at lr 3e-3 on
the CPU), while random tokens barely move (5.56 -> 5.55), which let a device that does not train pass a
parity check. So the verdict asks three things of the device's run, each of which a broken device fails:

- it ran where it claims: every parameter and the loss on the device type (a CPU fallback FAILs);
- it learned: the last loss at most ``LEARNED_RATIO`` of the first (a no-op optimizer or frozen
  parameters FAIL);
- it matches the CPU run from the same seed, step by step, within ``PARITY_RTOL``.

Precision: the parameters, the loss and the optimizer are fp32 on both sides, but the device may compute its
fp32 matmuls in bf16. TorchNeuron hands every graph to neuronx-cc, whose documented default for that has
moved (the mixed-precision guide: fp32 matmuls auto-cast to bf16, fp32 accumulation; the compiler's 2.27.0
release notes: ``--auto-cast`` defaults to ``none`` since then), and no TorchNeuron page says which flags it
passes. So every tolerance here is set for the worse case, bf16 matmuls, and measured on the CPU with a bf16
stand-in (``train(..., matmul_dtype=torch.bfloat16)``): a healthy bf16 device is off by at most 0.09 %
step by step (PARITY_RTOL 2 %) and 0.29 % on the 128x128 matmul (MATMUL_RTOL), while eleven device faults
still FAIL (tests/payloads/test_trn2_acceptance.py, its fault table).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

STEPS = 20
LEARNING_RATE = 3e-3
LEARNED_RATIO = 0.5  # the last loss must be at most half the first (the CPU reaches about 0.2)
PARITY_RTOL = 0.02  # bf16 matmuls: 0.0009 at most on the CPU stand-in; the faults: 0.05 and more
# The device check's matmul, as the Frobenius norm of the difference over the CPU's: bf16 rounds each input
# to 8 significant bits (unit roundoff 2**-8 = 0.0039; measured 0.0029 on the 128x128 product), fp8 e4m3
# to 4 (0.037): the bound sits between, so a bf16 device passes and one computing coarser fails.
MATMUL_RTOL = 2.5 * 2**-8
MATMUL_SIZE = 128
VOCAB, CYCLE, ROWS, LENGTH = 256, 16, 4, 64

# A change made to the model and optimizer before training, for the tests' broken devices.
Mutation = Callable[[object, object], object]


@dataclass
class TinyRun:
    losses: list[float]
    ran_on: list[str]  # device types holding the parameters and the loss after training
    graphs: list[int] = field(default_factory=list)  # NEFF files after each step (empty off Neuron)
    fallbacks: list[str] = field(default_factory=list)  # fallback messages seen


def batches(steps: int, seed: int):
    """``steps`` batches of ROWS x LENGTH tokens, each row the fixed cycle from a random start."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    cycle = torch.randperm(VOCAB, generator=generator)[:CYCLE]
    starts = torch.randint(0, CYCLE, (steps, ROWS, 1), generator=generator)
    return cycle[(starts + torch.arange(LENGTH)) % CYCLE]


def tiny_model(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=128, **shape))


def matmul_difference(device_name: str, matmul_dtype=None) -> float:
    """A seeded MATMUL_SIZE square matrix times itself on the device (``matmul_dtype``: computed in that
    dtype, the CPU stand-in of a bf16 device), against the CPU's fp32 product: ||D - C|| / ||C||."""
    import torch

    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=torch.Generator().manual_seed(0))
    on_device = a.to(device_name)
    if matmul_dtype is not None:
        on_device = on_device.to(matmul_dtype)
    product = (on_device @ on_device).float().cpu()
    expected = a @ a
    return float((product - expected).norm() / expected.norm())


def train(
    device_name: str,
    *,
    steps: int = STEPS,
    seed: int = 0,
    mutate: Mutation | None = None,
    after_step=None,
    matmul_dtype=None,
) -> TinyRun:
    """fp32 AdamW on the task; ``mutate(model, optimizer)`` returns the optimizer to use (tests break it);
    ``after_step(run)`` is called after each step (the NEFF count on Neuron); ``matmul_dtype`` computes the
    forward's matmuls in that dtype (autocast), as a device that casts fp32 matmuls does."""
    import contextlib

    import torch

    model = tiny_model(seed).to(device_name)

    def casting():
        return contextlib.nullcontext() if matmul_dtype is None else torch.autocast(device_name, dtype=matmul_dtype)

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    if mutate is not None:
        optimizer = mutate(model, optimizer)
    run = TinyRun([], [])
    loss = None
    for batch in batches(steps, seed):
        tokens = batch.to(device_name)
        with casting():
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        run.losses.append(float(loss.detach().cpu()))
        if after_step is not None:
            after_step(run)
    places = {parameter.device.type for parameter in model.parameters()}
    run.ran_on = sorted(places | ({loss.device.type} if loss is not None else set()))
    return run


def learned(losses: list[float]) -> bool:
    return bool(losses) and math.isfinite(losses[-1]) and losses[-1] <= LEARNED_RATIO * losses[0]


def verdict(kind: str, reference: TinyRun, run: TinyRun) -> tuple[bool, str, dict]:
    """(passed, one line, figures) for ``run`` on device ``kind`` against the CPU ``reference``."""
    # A NaN compares false with every bound: count it as infinitely far off.
    worst = max(
        abs(d - c) / abs(c) if math.isfinite(d) else math.inf for d, c in zip(run.losses, reference.losses, strict=True)
    )
    problems = []
    if run.ran_on != [kind]:
        problems.append(f"ran on {', '.join(run.ran_on)}, not {kind} only")
    if not learned(run.losses):
        problems.append(f"did not learn (last loss above {LEARNED_RATIO} x the first)")
    if worst > PARITY_RTOL:
        problems.append(f"differs from the CPU by up to {worst:.4f} (tolerance {PARITY_RTOL})")
    line = (
        f"{len(run.losses)} steps on {kind}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f} "
        f"(CPU {reference.losses[0]:.4f} -> {reference.losses[-1]:.4f}); largest relative difference {worst:.4f}"
    )
    figures = {
        "cpu_losses": reference.losses,
        "device_losses": run.losses,
        "ran_on": run.ran_on,
        "max_relative_difference": worst,
    }
    return not problems, line + (": " + "; ".join(problems) if problems else ""), figures
