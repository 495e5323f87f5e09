"""A run's states and the moves between them, as the train, consolidate and merge steps see them.

- running, or stopped (killed; or stopped by the NaN guard, exit 2): checkpoints and no finished marker.
  A resubmission resumes from the newest complete checkpoint.
- finished: ``checkpoints/finished.json`` (run_files.FinishedRecord) names the step the run reached. The
  train step writes it only when that step is the run's end (train.max_steps, or where its epochs end)
  and was good (a bad last step stops the run instead: training/loss_guard.py). consolidate and merge
  ship that checkpoint and no other.
- resubmitted after it finished: with the same values of every key that changes what the run learns
  (config.learning_keys; the others, such as logging and save cadence, change nothing learned) there is
  nothing to train. A larger train.max_steps (or train.epochs) extends it: the marker goes, and it trains
  on from the finished checkpoint to the new end, whatever else changed applying to the new steps. Any
  other change of a learning key is refused, naming the keys and the two ways forward.
- replaced: submit --replace-outputs moves its checkpoints folder (when the config changes what the finished
  run learned: replaced_by) and the outputs made after train aside; the run starts anew from the base model.

Stdlib only, like config.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llm_pipeline.errors import StepError
from llm_pipeline.run_files import CHECKPOINT, FINISHED_FILE, FinishedRecord
from llm_pipeline.weights.checkpoints import COMPLETE_MARKER, newest_complete

REPLACE_FLAG = "--replace-outputs"  # submit's flag (submit.py) that moves an earlier training aside


class RunStateError(StepError):
    """A move the run's state does not allow: it would train past its end, change what a finished run
    learned, or ship a checkpoint that is not the finished one."""


def marker_path(checkpoints_dir: Path) -> Path:
    return Path(checkpoints_dir) / FINISHED_FILE


def read_finished(checkpoints_dir: Path) -> FinishedRecord | None:
    """The finished marker, or None (no marker; an unreadable one counts as none: the run resumes, and its
    end is marked again when the newest checkpoint is it)."""
    try:
        return FinishedRecord.from_json(marker_path(checkpoints_dir).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _as_json(values: Any) -> Any:
    """Values as a marker holds them (tuples become lists), so a fresh config compares equal to a record."""
    return json.loads(json.dumps(values))


def record_finished(checkpoints_dir: Path, step: int, learned: dict[str, dict]) -> None:
    """Mark the run finished at ``step`` (written whole: a reader sees the old marker or the new one)."""
    marker = marker_path(checkpoints_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_suffix(".tmp")
    partial.write_text(FinishedRecord(step, _as_json(learned)).to_json())
    partial.replace(marker)


def forget_finished(checkpoints_dir: Path) -> None:
    """The run trains again (an extension): until it reaches its new end it has not finished."""
    marker_path(checkpoints_dir).unlink(missing_ok=True)


def changed_keys(record: FinishedRecord, learned: dict[str, dict]) -> list[str]:
    """The learning keys whose value differs from the finished run's, each with both values."""
    now = _as_json(learned)
    return [
        f"{section}.{key} (finished with {old!r}, now {now[section][key]!r})"
        for section, values in record.learned.items()
        for key, old in values.items()
        if key in now.get(section, {}) and now[section][key] != old
    ]


def extends(record: FinishedRecord, learned: dict[str, dict]) -> bool:
    """Whether the config ends the run later than where it finished: a train.max_steps above the finished
    step, or (epochs deciding, then and now) more train.epochs."""
    train, then = learned["train"], record.learned.get("train", {})
    if train["max_steps"] > 0:
        return train["max_steps"] > record.step
    return then.get("max_steps") == -1 and train["epochs"] > then.get("epochs", float("inf"))


def replaced_by(record: FinishedRecord | None, learned: dict[str, dict]) -> list[str]:
    """The learning keys that make this config another run than the finished one (empty: the same run, or
    an extension, or no finished run): such a config trains anew only once the checkpoints are moved aside."""
    if record is None or extends(record, learned):
        return []
    return changed_keys(record, learned)


def refusal(record: FinishedRecord, changed: list[str], checkpoints_dir: Path) -> str:
    return (
        f"this run finished at step {record.step} ({marker_path(checkpoints_dir)}) with other values of keys that "
        f"change what it learns: {'; '.join(changed)}. To train anew from the base model, resubmit with "
        f"{REPLACE_FLAG} (which moves {checkpoints_dir} and the outputs made after train aside into the run "
        f"folder's replaced/<time>/); or extend it: set train.max_steps above {record.step} to train on from "
        f"{CHECKPOINT.name(record.step)} with these values"
    )


def trains_on(record: FinishedRecord | None, learned: dict[str, dict], checkpoints_dir: Path) -> bool:
    """Whether a run with these learning values trains: True without a finished run or when the config
    extends it; False when it finished with these values (nothing to train). Refused otherwise."""
    if record is None or extends(record, learned):
        return True
    changed = replaced_by(record, learned)
    if not changed:
        return False
    raise RunStateError(refusal(record, changed, checkpoints_dir))


def trainer_steps(checkpoint: Path) -> tuple[int, int] | None:
    """(the step it holds, the run's end) from a checkpoint's trainer_state.json; None when unreadable."""
    try:
        state = json.loads((Path(checkpoint) / COMPLETE_MARKER).read_text())
        return int(state["global_step"]), int(state["max_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mark_if_finished(checkpoints_dir: Path, learned: dict[str, dict]) -> int | None:
    """Write the marker when the newest complete checkpoint is the run's end (its trainer_state says it
    reached max_steps); the step marked, or None (stopped early: stop_after_step, no checkpoint)."""
    newest = newest_complete(Path(checkpoints_dir))
    steps = trainer_steps(newest[1]) if newest else None
    if steps is None or steps[0] != steps[1] or steps[0] != newest[0]:
        return None
    record_finished(checkpoints_dir, newest[0], learned)
    return newest[0]


def finished_checkpoint(checkpoints_dir: Path) -> Path:
    """The finished run's checkpoint, which consolidate and merge ship; refused, naming both steps, when the
    run has not finished or its newest complete checkpoint is another step than the finished one."""
    checkpoints_dir = Path(checkpoints_dir)
    record, newest = read_finished(checkpoints_dir), newest_complete(checkpoints_dir)
    newest_text = CHECKPOINT.name(newest[0]) if newest else "no complete checkpoint"
    if record is None:
        raise RunStateError(
            f"{checkpoints_dir}: training has not finished (no {FINISHED_FILE}; newest: {newest_text}), so there is "
            "no result to ship: resubmit from train to finish the run"
        )
    if newest is None or newest[0] != record.step:
        raise RunStateError(
            f"{checkpoints_dir}: the newest complete checkpoint is {newest_text}, not "
            f"{CHECKPOINT.name(record.step)}, the step {marker_path(checkpoints_dir)} says the run finished at: "
            "resubmit from train to finish the run"
        )
    return newest[1]
