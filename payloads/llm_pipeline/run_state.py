"""A run's states and the moves between them, as the train, consolidate and merge steps see them.

- running, or stopped (killed; or stopped by the NaN guard, exit 2): checkpoints and no finished marker.
  A resubmission resumes from the newest complete checkpoint.
- every checkpoint records what trained it (run_files.TrainedFrom, ``trained_from.json``): the values of every
  key that changes what the run learns (config.learning_keys; the others, such as logging and save cadence,
  change nothing learned) and the digests of its inputs (run_inputs.py: model weights, tokenizer, dataset,
  prepared data). Every move below compares against that record, never against the newest config alone.
- resumed: from the newest complete checkpoint, with a config and inputs equal to its record; any difference
  (a key, refilled weights, a rewritten dataset) is refused naming them and the ways forward. The folders newer
  than the one it resumes from are incomplete and are discarded first (discard_after; a training job's hosts after
  they agree on that one, gather.py).
- finished: ``checkpoints/finished.json`` (run_files.FinishedRecord) names the step the run reached and is
  a copy of that checkpoint's record: the train step writes it only when that checkpoint is the run's end by
  its own trainer state (its train.max_steps, or where its epochs end) and was good (a bad last step stops the
  run instead: training/loss_guard.py), whatever the config resubmitted after it says. consolidate and merge
  ship that checkpoint and no other, and only while the config (and, for merge, the model) is what trained it.
- resubmitted after it finished (a checkpoint at its own end, marked or not): with an equal record there is
  nothing to train. A larger train.max_steps (or train.epochs) extends it: the marker goes, and it trains on
  from the finished checkpoint to the new end, whatever else changed in keys or data applying to the new steps
  (EXTENSION_KEEPS: never the model). Any other difference is refused, naming it and the ways forward.
- replaced: submit --replace-outputs moves its checkpoints folder (when the config changes what the finished
  run learned: replaced_by) and the outputs made after train aside; the run starts anew from the base model.

The train step moves through these states with run_in_state, reading only the run-state record the step read
from the config (RunEnd). Stdlib only, like config.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_pipeline.errors import StepError
from llm_pipeline.run_files import (
    CHECKPOINT,
    FINISHED_FILE,
    INPUTS,
    RESUMING_FROM,
    TRAINED_FROM_FILE,
    BackendLine,
    FinishedRecord,
    TrainedFrom,
)
from llm_pipeline.weights.checkpoints import COMPLETE_MARKER, checkpoint_folders, newest_complete

if TYPE_CHECKING:
    from llm_pipeline.training.plan import TrainPlan

REPLACE_FLAG = "--replace-outputs"  # submit's flag (submit.py) that moves an earlier training aside
EXTENSION_KEEPS = ("model weights", "tokenizer")  # inputs an extension may not change (the keys and data may)
WAYS_FORWARD = (
    f"train anew from the base model, resubmit with {REPLACE_FLAG} (which moves the checkpoints and the outputs "
    "made after train aside into the run folder's replaced/<time>/) or use a new run folder (paths.output_dir)"
)


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """What the run's state rules read (run_in_state): where its checkpoints are, its end
    (train.max_steps) and what a checkpoint trained now records (run_inputs.trained_from); the train step reads it
    from the config with its other parts' records (train.read_run)."""

    checkpoints_dir: Path
    max_steps: int
    trained_from: TrainedFrom


def say(message: str) -> None:
    """The train step's progress line (training.plan.say). The train step's side imports the training modules, and
    only there: submit reads this module on the controller's Python 3.10, with the stdlib alone."""
    from llm_pipeline.training.plan import say as train_say

    train_say(message)


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


def record_finished(checkpoints_dir: Path, step: int, learned: dict[str, dict], inputs: dict | None = None) -> None:
    """Mark the run finished at ``step`` (written whole: a reader sees the old marker or the new one)."""
    marker = marker_path(checkpoints_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_suffix(".tmp")
    partial.write_text(FinishedRecord(step, _as_json(learned), dict(inputs or {})).to_json())
    partial.replace(marker)


def checkpoint_record(checkpoint: Path) -> TrainedFrom | None:
    """What trained a checkpoint (its trained_from.json); None for one saved before checkpoints recorded it."""
    try:
        return TrainedFrom.from_json((Path(checkpoint) / TRAINED_FROM_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def differences(then: TrainedFrom, now: TrainedFrom, was: str, inputs=tuple(INPUTS), keys: bool = True) -> list[str]:
    """What differs in ``now`` from the record ``then``: each learning key with both values (``was``: "finished
    with", ...), then each of ``inputs`` whose digest differs (one that either side lacks is not compared)."""
    learned = _as_json(now.learned)
    # a local dataset file is compared by its content, not its path (a restored job sees it under another root)
    by_content = {("data", "dataset")} if then.inputs.get("dataset") and now.inputs.get("dataset") else set()
    keys_changed = [
        f"{section}.{key} ({was} {old!r}, now {learned[section][key]!r})"
        for section, values in (then.learned.items() if keys else ())
        for key, old in values.items()
        if key in learned.get(section, {}) and learned[section][key] != old and (section, key) not in by_content
    ]
    changed = [
        f"{name} ({INPUTS[name]}: changed since)"
        for name in inputs
        if then.inputs.get(name) and now.inputs.get(name) and then.inputs[name] != now.inputs[name]
    ]
    return keys_changed + changed


def forget_finished(checkpoints_dir: Path) -> None:
    """The run trains again (an extension): until it reaches its new end it has not finished."""
    marker_path(checkpoints_dir).unlink(missing_ok=True)


def changed_keys(record: FinishedRecord, learned: dict[str, dict]) -> list[str]:
    """The learning keys whose value differs from the finished run's, each with both values."""
    return differences(record.trained_from, TrainedFrom(learned), "finished with", inputs=())


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
        f"change what it learns, or other inputs: {'; '.join(changed)}. To {WAYS_FORWARD}; "
        f"or extend it: set train.max_steps above {record.step} to train on from {CHECKPOINT.name(record.step)} "
        "with these values"
    )


def resume_refusal(checkpoint: Path, changed: list[str]) -> str:
    return (
        f"this run's newest checkpoint, {checkpoint}, was trained with other values or inputs than this "
        f"submission's: {'; '.join(changed)}. To resume it, resubmit with what trained it (its {TRAINED_FROM_FILE}); "
        f"to {WAYS_FORWARD}"
    )


def extension_refusal(record: FinishedRecord, changed: list[str], checkpoints_dir: Path) -> str:
    return (
        f"this run finished at step {record.step} ({marker_path(checkpoints_dir)}); an extension trains on from "
        f"{CHECKPOINT.name(record.step)} and so keeps its model, but: {'; '.join(changed)}. Put the model back, "
        f"or, to {WAYS_FORWARD}"
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


def trains_from(checkpoints_dir: Path, now: TrainedFrom) -> FinishedRecord | bool:
    """What a train step with ``now`` (run_inputs.trained_from) does in this checkpoints folder: True: it trains
    (no checkpoint, a resume with an equal record, or an extension); the finished run's FinishedRecord: nothing
    to train (the record it is to be marked with). Refused, in one line, for every other difference."""
    checkpoints_dir = Path(checkpoints_dir)
    newest = newest_complete(checkpoints_dir)
    marker = read_finished(checkpoints_dir)
    if newest is None:
        return True
    then = checkpoint_record(newest[1])
    if then is None:  # saved before checkpoints recorded what trained them: the marker's record, when it is this one
        finished = marker if marker is not None and marker.step == newest[0] else None
        return finished if finished is not None and not trains_on(finished, now.learned, checkpoints_dir) else True
    if not at_its_end(newest):
        changed = differences(then, now, "trained with")
        if changed:
            raise RunStateError(resume_refusal(newest[1], changed))
        return True
    finished = FinishedRecord(newest[0], then.learned, then.inputs)
    if extends(finished, now.learned):
        changed = differences(then, now, "finished with", inputs=EXTENSION_KEEPS, keys=False)
        if changed:
            raise RunStateError(extension_refusal(finished, changed, checkpoints_dir))
        return True
    changed = differences(then, now, "finished with")
    if changed:
        raise RunStateError(refusal(finished, changed, checkpoints_dir))
    return finished


def trainer_steps(checkpoint: Path) -> tuple[int, int] | None:
    """(the step it holds, the run's end) from a checkpoint's trainer_state.json; None when unreadable."""
    try:
        state = json.loads((Path(checkpoint) / COMPLETE_MARKER).read_text())
        return int(state["global_step"]), int(state["max_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def at_its_end(checkpoint: tuple[int, Path]) -> bool:
    """Whether a complete checkpoint is its run's end by its own trainer state: it reached its max_steps."""
    steps = trainer_steps(checkpoint[1])
    return steps is not None and steps[0] == steps[1] == checkpoint[0]


def mark_if_finished(checkpoints_dir: Path) -> int | None:
    """Write the marker when the newest complete checkpoint is the run's end (its trainer_state says it
    reached max_steps), from that checkpoint's record alone (whatever config runs now); the step marked, or
    None (stopped early: stop_after_step, no checkpoint, or one without a record)."""
    newest = newest_complete(Path(checkpoints_dir))
    if newest is None or not at_its_end(newest):
        return None
    record = checkpoint_record(newest[1])
    if record is None:
        return None
    record_finished(checkpoints_dir, newest[0], record.learned, record.inputs)
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


def shipped_checkpoint(checkpoints_dir: Path, now: TrainedFrom, step: str) -> Path:
    """The finished checkpoint (finished_checkpoint) that ``step`` (consolidate, merge) ships, refused in one line
    when the config (or, as far as ``now`` has them, the inputs) differs from what trained it: a raised
    train.max_steps is trained first (submit from train), never shipped as the shorter run."""
    folder = finished_checkpoint(checkpoints_dir)
    record = read_finished(checkpoints_dir)
    then = checkpoint_record(folder) or record.trained_from
    changed = differences(then, now, "finished with")
    if changed:
        raise RunStateError(
            f"{step} would ship {folder}, which was not trained with this config and inputs: {'; '.join(changed)}. "
            f"To ship it, set the keys back (its {TRAINED_FROM_FILE} holds them); to train on to a raised "
            f"train.max_steps first, submit from train (an extension); to {WAYS_FORWARD}"
        )
    return folder


def discard_after(checkpoints_dir: Path, step: int) -> list[Path]:
    """Delete the checkpoint folders newer than ``step``, the newest complete checkpoint (0: none), on this
    node's disk. None of them is complete; saving the same step again into one would mix its leftovers
    (a partial restore's, an interrupted save's) into the new checkpoint and into the seals that list
    what the folder holds. Returns what was deleted."""
    newer = [folder for found, folder in checkpoint_folders(checkpoints_dir) if found > step]
    for folder in newer:
        shutil.rmtree(folder, ignore_errors=True)  # on a shared file system every node may try
    return newer


def check_not_past_end(end: RunEnd, plan: TrainPlan) -> bool:
    """A run never trains past its end: False when the checkpoint it starts from is already train.max_steps
    but not its run's end by its own record (run_in_state refuses it: a finished one never gets here), refused
    when it is beyond (a lower max_steps)."""
    if end.max_steps <= 0 or plan.start_step < end.max_steps:
        return True  # epochs decide: the Trainer starts no epoch past the last one
    if plan.start_step > end.max_steps:
        raise RunStateError(
            f"train.max_steps = {end.max_steps}, but this run's checkpoint {plan.resume_from} is step "
            f"{plan.start_step}: it would train past its end. Set train.max_steps above {plan.start_step} to extend "
            f"it, or resubmit with {REPLACE_FLAG} to train anew"
        )
    return False


def finished_already(end: RunEnd) -> bool:
    """Whether a finished run has nothing to train with this config and these inputs (end.trained_from),
    compared against its newest checkpoint's own record (trains_from: refused on any difference but an
    extension, which drops the marker and trains on). A run at its end without a marker (killed after its last
    save) gets it, copied from that checkpoint's record."""
    checkpoints = end.checkpoints_dir
    finished = trains_from(checkpoints, end.trained_from)
    if finished is True:
        record = read_finished(checkpoints)
        if record is not None and record.step == (newest_complete(checkpoints) or (0,))[0]:
            say(f"extending the run that finished at step {record.step}: training on to train.max_steps")
        return False
    if os.environ.get("RANK", "0") == "0":
        mark_if_finished(checkpoints)
    say(
        f"training already finished at step {finished.step} ({marker_path(checkpoints)}), and no key "
        "that changes what it learns and no input differs: nothing to do; raise train.max_steps (or train.epochs) "
        "to train on"
    )
    return True


def run_in_state(end: RunEnd, plan: TrainPlan, engine, *, precompile: bool = False) -> TrainPlan:
    """The train step's move: ``engine(plan)`` as the run's state allows: not at all for a finished run or one at
    its end, refused past its end or when it would change what a finished run learned; then marked finished when
    its newest checkpoint is its end."""
    rank_zero = os.environ.get("RANK", "0") == "0"
    if finished_already(end):
        return plan  # a resubmitted finished run would otherwise recompile and take one more (zero-LR) step
    if not precompile and not check_not_past_end(end, plan):
        raise RunStateError(
            f"the newest checkpoint, {plan.resume_from}, is step train.max_steps = {end.max_steps} but not its "
            f"run's end by its own trainer state, or it has no {TRAINED_FROM_FILE}: set train.max_steps above "
            f"{plan.start_step} to train on, or, to {WAYS_FORWARD}"
        )
    # each checkpoint's record (SealCheckpoints)
    plan = dataclasses.replace(plan, trained_from=end.trained_from.to_json())
    if not precompile and rank_zero:
        forget_finished(end.checkpoints_dir)  # an extension: finished again only at its new end
    if not precompile and os.environ.get("LOCAL_RANK", "0") == "0":  # each node's disk (a training job's hosts)
        for folder in discard_after(end.checkpoints_dir, plan.start_step):
            print(f"discarded {folder}: incomplete, newer than the checkpoint training starts from", flush=True)
    what = "precompile run" if precompile else "training"
    start = f"{RESUMING_FROM}{plan.resume_from}" if plan.resume_from else "from the base model"
    if os.environ.get("LOCAL_RANK", "0") == "0":  # each node: a training job's hosts resume from their own folders
        print(BackendLine(what, plan.backend, start).format(), flush=True)
    engine(plan)
    if not precompile:
        newest = newest_complete(end.checkpoints_dir)
        say(f"training done; newest checkpoint: {newest[1] if newest else 'none'}")
        if rank_zero:
            finished = mark_if_finished(end.checkpoints_dir)
            say(f"finished at step {finished}" if finished else "not at the run's end: not marked finished")
    return plan
