"""What the Trainium2 acceptance measures its fleet levels against: the loss curve they must follow, and
each instance type's reference figures with their source (stdlib only: the host side reads it too).

Loss: a level's run must fall, never rise, stay flat or go NaN. How far it must fall comes from the CPU
reference in the repo (training/tiny_task.py, the token cycle a tiny Llama learns) run for the level's own
number of steps: ``loss_reference.json`` beside this file, written by ``python -m tools.record_loss_reference``
(a test checks the file against a fresh run). The level passes when its relative fall, first window to last
window, is at least REFERENCE_SHARE of the reference's over the same steps. The 8B LoRA run starts from a
pretrained model and learns far slower than the tiny task, hence the small share; it is not measured on a
device yet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

REFERENCE_FILE = Path(__file__).with_name("loss_reference.json")
REFERENCE_SHARE = 0.1  # of the reference's relative fall over the same steps; not measured on device
WINDOW = 3  # steps averaged at each end, so one noisy step neither passes nor fails a run

# Per instance type: the figure, its unit and its public source. Printed beside what a node measures;
# none of them is a bound (no device has run the acceptance yet: "not measured on device").
REFERENCES = {
    "ml.trn2.48xlarge": {
        "efa_bus_gbps": (3200.0, "Gbit/s", "EC2 Trn2 instance page: 3.2 Tbps EFAv3 per trn2.48xlarge"),
        "device_memory_gib": (1536.0, "GiB", "Neuron Trn2 architecture page: 16 chips x 96 GiB HBM"),
        "trn1_samples_per_second": (
            3.554 * 4,
            "samples/s",
            "the trn1.32xlarge Llama 3 8B LoRA blog run: 3.554 per data-parallel replica x 4 replicas a node",
        ),
    },
}


def reference_curve(steps: int, path: Path = REFERENCE_FILE) -> list[float]:
    curves = json.loads(path.read_text())["curves"]
    if str(steps) not in curves:
        raise KeyError(f"{path} has no {steps}-step curve: run python -m tools.record_loss_reference")
    return curves[str(steps)]


def relative_fall(losses: list[float]) -> float:
    window = min(WINDOW, max(1, len(losses) // 2))
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    return (first - last) / first


def curve_verdict(losses: list[float], reference: list[float]) -> tuple[bool, str, dict]:
    """(passed, line, figures) for a level's per-step losses against the reference of the same length."""
    bound = REFERENCE_SHARE * relative_fall(reference)
    figures: dict = {"losses": losses, "bound_relative_fall": bound}
    if len(losses) != len(reference):
        return False, f"{len(losses)} losses logged, {len(reference)} expected (one a step)", figures
    bad = [step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)]
    if bad:
        return False, f"the loss went NaN or infinite at step {bad[0]}", figures
    fall = relative_fall(losses)
    figures["relative_fall"] = fall
    line = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}: fell {fall:.1%} (bound {bound:.1%})"
    if fall < 0:
        return False, line + ": the loss rose", figures
    if fall < bound:
        return False, line + ": the loss stayed flat", figures
    return True, line, figures
