"""Read torchtitan 0.2.2's own metric lines from a job log and sum a rung up.

torchtitan's MetricsProcessor.log (torchtitan/components/metrics.py) prints, every
metrics.log_freq steps and at step 1, through its logger ("[titan] <time> - root - INFO - "):

    step: 10  loss:  9.12345  grad_norm:  1.2345  memory: 61.05GiB(77.17%)  tps: 6,475  tflops: 374.71  mfu: 37.89%

tps is tokens per second per GPU, memory the peak reserved device memory since the last line.
Every rank prints its own line (torchrun without a rank filter), so lines are grouped by step:
loss is already the global average, tps and mfu are averaged over ranks, memory is the maximum.
With colors on, ANSI codes sit between the fields; they are removed first. The line's format is
the run files' (llm_pipeline/run_files.py): this module sums a rung's lines up.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from llm_pipeline.run_files import TitanMetricLine, titan_device


@dataclass(frozen=True)
class RungSummary:
    """One rung's figures; tps/mfu/tflops are medians over the steady-state log steps."""

    lines: int  # metric lines read (all ranks)
    ranks: int  # lines per logged step (the ranks that print)
    last_step: int
    final_loss: float  # at last_step
    tps: float  # tokens/s per GPU
    mfu: float  # percent
    tflops: float
    memory_gib: float  # peak reserved, maximum over ranks and steps
    memory_pct: float
    steady_steps: tuple[int, ...]  # the logged steps the medians are taken over
    device: str

    def to_dict(self) -> dict:
        return asdict(self)


def steady_steps(steps: list[int]) -> list[int]:
    """Logged steps past warm-up: never step 1 (it carries start-up and compilation), nor the first
    tenth of the run; all but step 1 when that leaves nothing, all when only step 1 was logged."""
    last = max(steps)
    for chosen in ([s for s in steps if s > max(1, last // 10)], [s for s in steps if s > 1], steps):
        if chosen:
            return chosen
    return steps


def summarize(text: str) -> RungSummary | None:
    """The summary of one rung's log, or None when it holds no metric line."""
    lines = TitanMetricLine.parse_all(text)
    if not lines:
        return None
    by_step: dict[int, list[TitanMetricLine]] = {}
    for line in lines:
        by_step.setdefault(line.step, []).append(line)
    steps = sorted(by_step)
    chosen = steady_steps(steps)

    def mean(step: int, name: str) -> float:
        return statistics.fmean(getattr(line, name) for line in by_step[step])

    last = steps[-1]
    return RungSummary(
        lines=len(lines),
        ranks=max(len(group) for group in by_step.values()),
        last_step=last,
        final_loss=by_step[last][-1].loss,
        tps=statistics.median(mean(step, "tps") for step in chosen),
        mfu=statistics.median(mean(step, "mfu") for step in chosen),
        tflops=statistics.median(mean(step, "tflops") for step in chosen),
        memory_gib=max(line.memory_gib for line in lines),
        memory_pct=max(line.memory_pct for line in lines),
        steady_steps=tuple(chosen),
        device=titan_device(text),
    )


def summarize_file(path: Path) -> RungSummary | None:
    return summarize(path.read_text(errors="replace"))
