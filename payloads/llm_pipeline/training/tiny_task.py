"""A tiny task a device must learn, and the verdict on a device's run of it against the CPU's.

The task is a fixed cycle of tokens (each token has one successor), every row a rotation of it: a tiny
random Llama learns that map within a few steps (loss about 5.6 -> 1.1 in 20 AdamW steps at lr 3e-3 on
the CPU), while random tokens barely move (5.56 -> 5.55), which let a device that does not train pass a
parity check. So the verdict asks three things of the device's run, each of which a broken device fails:

- it ran where it claims: every parameter and the loss on the device type (a CPU fallback FAILs);
- it learned: the last loss at most ``LEARNED_RATIO`` of the first (a no-op optimizer or frozen
  parameters FAIL);
- it matches the CPU run from the same seed, step by step, within ``PARITY_RTOL`` (both fp32; only the
  reduction order differs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

STEPS = 20
LEARNING_RATE = 3e-3
LEARNED_RATIO = 0.5  # the last loss must be at most half the first (the CPU reaches about 0.2)
PARITY_RTOL = 0.02
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


def train(
    device_name: str, *, steps: int = STEPS, seed: int = 0, mutate: Mutation | None = None, after_step=None
) -> TinyRun:
    """fp32 AdamW on the task; ``mutate(model, optimizer)`` returns the optimizer to use (tests break it);
    ``after_step(run)`` is called after each step (the NEFF count on Neuron)."""
    import torch

    model = tiny_model(seed).to(device_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    if mutate is not None:
        optimizer = mutate(model, optimizer)
    run = TinyRun([], [])
    loss = None
    for batch in batches(steps, seed):
        tokens = batch.to(device_name)
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
    return bool(losses) and losses[-1] <= LEARNED_RATIO * losses[0]


def verdict(kind: str, reference: TinyRun, run: TinyRun) -> tuple[bool, str, dict]:
    """(passed, one line, figures) for ``run`` on device ``kind`` against the CPU ``reference``."""
    worst = max(abs(d - c) / abs(c) for d, c in zip(run.losses, reference.losses, strict=True))
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
