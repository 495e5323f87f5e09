"""Read a run's loss curve from what its backend already wrote, for charts and `compare`.

- torch and neuron runs: the TensorBoard events in ``<run>/tensorboard/`` (training/callbacks.py
  writes ``train/loss`` every logging step, and ``model/sequences_per_step`` and
  ``model/sequence_length`` once); without events, the progress lines of ``<run>/logs/train-*.log``
  (``step 20/40 | loss 1.2345 | ...``).
- torchtitan ladders: torchtitan's own metric lines in ``<run>/logs/rung-<rung>-<job>.log``, one
  curve per rung (run_files.TitanMetricLine reads them; the loss is already the global mean).
- a single log file of either kind.

A restarted run logs the steps after its checkpoint again: the newest value of a step wins. Tokens
seen at a step are step x sequences per optimizer step x sequence length (token positions, padding
included), where the run recorded both; else the curve has steps only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from llm_pipeline.errors import StepError
from llm_pipeline.run_files import ProgressLine, StepLog, TitanMetricLine

TENSORBOARD_DIR = "tensorboard"
LOGS_DIR = "logs"
EVAL_FILE = Path("eval") / "eval.json"
LOSS_TAG = "train/loss"
LEARNING_RATE_TAG = "train/learning_rate"
SEQUENCES_TAG = "model/sequences_per_step"
LENGTH_TAG = "model/sequence_length"
RUNG_PREFIX = "rung-"  # a ladder rung's job: rung-<rung> (ladder_submit)


@dataclass(frozen=True)
class LossCurve:
    """One training curve: loss by optimizer step, and tokens seen at those steps when known."""

    label: str
    source: str  # the folder or file it was read from
    kind: str  # "events", "progress log" or "torchtitan log"
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    tokens_per_step: int | None = None
    evaluation: dict | None = field(default=None, compare=False)
    # (step, learning rate) where the run logged it (torch and neuron runs): the result chart draws it
    learning_rates: tuple[tuple[int, float], ...] = field(default=(), compare=False)

    @property
    def tokens(self) -> tuple[int, ...] | None:
        return None if self.tokens_per_step is None else tuple(s * self.tokens_per_step for s in self.steps)


def _newest_per_step(points: list[tuple[int, float]]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    by_step: dict[int, float] = {}
    for step, value in points:  # in the order written: a restart's later value replaces the earlier one
        by_step[step] = value
    steps = tuple(sorted(by_step))
    return steps, tuple(by_step[s] for s in steps)


def read_events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``folder`` (all files, oldest first), by tag."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(folder.glob("**/events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime, p.name))
    for path in files:
        for event in LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def _progress_points(text: str) -> list[tuple[int, float]]:
    return [(line.step, line.loss) for line in ProgressLine.parse_all(text)]


def _evaluation(run: Path) -> dict | None:
    path = run / EVAL_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _from_events(run: Path, label: str) -> LossCurve | None:
    scalars = read_events(run / TENSORBOARD_DIR)
    if not scalars.get(LOSS_TAG):
        return None
    steps, losses = _newest_per_step(scalars[LOSS_TAG])
    sequences, length = scalars.get(SEQUENCES_TAG), scalars.get(LENGTH_TAG)
    tokens_per_step = int(sequences[-1][1] * length[-1][1]) if sequences and length else None
    rates = tuple(zip(*_newest_per_step(scalars.get(LEARNING_RATE_TAG, [])), strict=True))
    return LossCurve(label, str(run), "events", steps, losses, tokens_per_step, _evaluation(run), rates)


def _from_train_logs(run: Path, label: str) -> LossCurve | None:
    logs = [path for _, path in StepLog.of(run / LOGS_DIR, lambda step: step == "train")]
    lines = [line for log in logs for line in ProgressLine.parse_all(log.read_text(errors="replace"))]
    if not lines:
        return None
    steps, losses = _newest_per_step([(line.step, line.loss) for line in lines])
    rates = tuple(zip(*_newest_per_step([(line.step, line.learning_rate) for line in lines]), strict=True))
    return LossCurve(label, str(run), "progress log", steps, losses, None, _evaluation(run), rates)


def _torchtitan_curve(log: Path, label: str) -> LossCurve | None:
    lines = TitanMetricLine.parse_all(log.read_text(errors="replace"))
    if not lines:
        return None
    steps, losses = _newest_per_step([(line.step, line.loss) for line in lines])
    return LossCurve(label, str(log), "torchtitan log", steps, losses)


def _from_rung_logs(run: Path) -> list[LossCurve]:
    newest: dict[str, Path] = {}
    # in submission order (job ids): the ladder's own rung order
    for log, path in StepLog.of(run / LOGS_DIR, lambda step: step.startswith(RUNG_PREFIX)):
        newest[log.step.removeprefix(RUNG_PREFIX)] = path
    curves = [_torchtitan_curve(log, f"{run.name}:{rung}") for rung, log in newest.items()]
    return [curve for curve in curves if curve is not None]


def read_run(path: Path, label: str | None = None) -> list[LossCurve]:
    """The loss curves of a run folder or a log file (a ladder folder gives one per rung)."""
    label = label or path.name
    if path.is_file():
        curve = _torchtitan_curve(path, label)
        if curve is None:
            steps, losses = _newest_per_step(_progress_points(path.read_text(errors="replace")))
            curve = LossCurve(label, str(path), "progress log", steps, losses) if steps else None
        if curve is None:
            raise StepError(
                f"{path} holds no loss lines (neither `step N/M | loss ...` nor torchtitan's `step: N loss: ...`)"
            )
        return [curve]
    if not path.is_dir():
        raise StepError(f"run {path} does not exist: give a run folder (paths.output_dir) or a training log file")
    curve = _from_events(path, label) if (path / TENSORBOARD_DIR).is_dir() else None
    curve = curve or _from_train_logs(path, label)
    if curve is not None:
        return [curve]
    rungs = _from_rung_logs(path)
    if rungs:
        return rungs
    raise StepError(
        f"run {path} has no loss to read: no {LOSS_TAG} in {path / TENSORBOARD_DIR}, no progress lines in "
        f"{path / LOGS_DIR}/train-*.log, no torchtitan metric lines in {path / LOGS_DIR}/rung-*.log"
    )
