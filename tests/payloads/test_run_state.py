"""A run's life as states (run_state.py): the finished marker names the run's end or does not exist, a finished run
resubmitted trains nothing, is extended, or is refused naming the keys that would change what it learned, no run
trains past its end, and consolidate and merge ship the finished checkpoint only.

These cases drive the train step's real state rules (train.read_run's plan and record, run_state.run_in_state)
and the real NaN guard with a stand-in engine that writes checkpoints (and their record) as the Trainer and
SealCheckpoints do, for speed; test_run_content.py drives every history through the real steps on the tiny model,
and test_run_life.py the real NaN skip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import consolidate, merge, run_state, train
from llm_pipeline.config import learning_keys
from llm_pipeline.run_files import TRAINED_FROM_FILE
from llm_pipeline.training.loss_guard import NonFiniteLoss, NonFiniteLossGuard
from llm_pipeline.weights.checkpoints import newest_complete
from tools import tiny_model

pytestmark = pytest.mark.both_stacks


class Killed(Exception):
    """The job was killed (node failure, scancel) at a step."""


class StandInEngine:
    """Trains from plan.start_step to train.max_steps as the Trainer does for these rules: at least one step
    (the Trainer takes one even when it starts at its end: the "step 13/12" run), a checkpoint every save_steps
    and at the end unless the step was bad, the real guard deciding each step from ``losses``."""

    def __init__(self, cfg, losses: dict[int, float], kill_at: int | None = None):
        self.cfg, self.losses, self.kill_at = cfg, losses, kill_at
        self.trained: list[int] = []

    def __call__(self, plan) -> None:
        end = self.cfg.train.max_steps
        assert plan.start_step < end, f"the engine was asked to train past its end ({plan.start_step} -> {end})"
        guard = NonFiniteLossGuard(
            grace=self.cfg.train.nonfinite_loss_grace, checkpoints_dir=self.cfg.paths.checkpoints_dir, last_step=end
        )
        applied = (
            json.loads((plan.resume_from / "trainer_state.json").read_text())["updates"] if plan.resume_from else []
        )
        for step in range(plan.start_step + 1, end + 1):
            if step == self.kill_at:
                raise Killed(step)
            self.trained.append(step)
            guard.observe(first=step, last=step, value=self.losses.get(step, 1.0))
            if guard.is_bad(step):
                continue
            applied = [*applied, step]
            if step % self.cfg.train.save_steps == 0 or step == end:
                folder = self.cfg.paths.checkpoints_dir / f"checkpoint-{step}"
                folder.mkdir(parents=True)
                (folder / TRAINED_FROM_FILE).write_text(plan.trained_from)  # as SealCheckpoints does
                state = {"global_step": step, "max_steps": end, "updates": applied}
                (folder / "trainer_state.json").write_text(json.dumps(state))


def submit(cfg, losses=None, kill_at=None) -> tuple[str, StandInEngine]:
    """One train step on ``cfg``: its outcome (trained, nothing, refused, stopped, killed) and the engine."""
    engine = StandInEngine(cfg, losses or {}, kill_at)
    try:
        records = train.read_run(cfg, "torch")
        run_state.run_in_state(records.end, records.plan, engine)
    except run_state.RunStateError:
        return "refused", engine
    except NonFiniteLoss:
        return "stopped", engine
    except Killed:
        return "killed", engine
    return ("trained" if engine.trained else "nothing"), engine


def _config(env, **train_keys):
    keys = {"save_steps": 2, "logging_steps": 1, "nonfinite_loss_grace": 1, **train_keys}
    return tiny_config(env, train=keys)


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_learning_keys_are_the_fields_that_say_so():
    keys = learning_keys()
    assert "learning_rate" in keys["train"] and "max_steps" in keys["train"] and "r" in keys["lora"]
    assert "dataset" in keys["data"] and "packing" in keys["data"]
    for cadence in ("logging_steps", "save_steps", "save_total_limit", "nonfinite_loss_grace", "profile"):
        assert cadence not in keys["train"]


def test_a_nan_at_the_last_step_within_the_grace_stops_the_run_unmarked(hpl_env):
    cfg = _config(hpl_env, max_steps=4)
    outcome, _ = submit(cfg, {4: float("nan")})
    assert outcome == "stopped"
    assert run_state.read_finished(cfg.paths.checkpoints_dir) is None
    assert newest_complete(cfg.paths.checkpoints_dir)[0] == 2  # resumable from the last good checkpoint


def test_a_finished_run_resubmitted_with_logging_changed_trains_nothing(hpl_env, capsys):
    assert submit(_config(hpl_env, max_steps=4))[0] == "trained"
    capsys.readouterr()
    assert submit(_config(hpl_env, max_steps=4, logging_steps=2, save_steps=1))[0] == "nothing"
    assert "training already finished at step 4" in capsys.readouterr().out


def test_a_finished_run_resubmitted_with_a_learning_key_changed_is_refused_naming_it(hpl_env, tmp_path, capsys):
    cfg = _config(hpl_env, max_steps=4)
    assert submit(cfg)[0] == "trained"
    before = _files(cfg.paths.checkpoints_dir)
    path = write_config(tmp_path / "run.toml", hpl_env, train={"max_steps": 4, "save_steps": 2, "learning_rate": 1e-3})
    assert train.main(["--config", str(path)]) == 2  # the step's CLI: one error line, exit 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: this run finished at step 4")
    assert "train.learning_rate (finished with 0.005, now 0.001)" in err
    assert "--replace-outputs" in err and "set train.max_steps above 4" in err
    assert _files(cfg.paths.checkpoints_dir) == before


def test_an_extension_trains_on_and_is_finished_again_only_at_its_new_end(hpl_env):
    cfg = _config(hpl_env, max_steps=4)
    submit(cfg)
    longer = _config(hpl_env, max_steps=8, learning_rate=1e-3)  # an extension may change what the new steps learn
    outcome, engine = submit(longer, kill_at=7)
    assert (outcome, engine.trained) == ("killed", [5, 6])
    assert run_state.read_finished(cfg.paths.checkpoints_dir) is None  # running again: not finished
    outcome, engine = submit(longer)
    assert (outcome, engine.trained) == ("trained", [7, 8])
    assert run_state.read_finished(cfg.paths.checkpoints_dir).step == 8


def test_a_run_whose_newest_checkpoint_is_beyond_max_steps_is_refused(hpl_env):
    submit(_config(hpl_env, max_steps=6))
    run_state.forget_finished(_config(hpl_env).paths.checkpoints_dir)
    assert submit(_config(hpl_env, max_steps=4))[0] == "refused"


def test_consolidate_and_merge_refuse_a_checkpoint_that_is_not_the_finished_one(hpl_env, tmp_path, capsys):
    cfg = _config(hpl_env, max_steps=4)
    submit(cfg, kill_at=4)  # checkpoint-2, not finished
    path = write_config(tmp_path / "run.toml", hpl_env)
    for step in (consolidate, merge):
        assert step.main(["--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert "training has not finished (no finished.json; newest: checkpoint-2)" in err, err
    submit(cfg)  # finishes at 4
    run_state.record_finished(cfg.paths.checkpoints_dir, 6, cfg.learned())  # a marker naming another step
    assert consolidate.main(["--config", str(path)]) == 2
    assert "the newest complete checkpoint is checkpoint-4, not checkpoint-6" in capsys.readouterr().err


def test_the_marker_is_written_only_at_the_checkpoints_own_end_and_copies_its_record(hpl_env):
    cfg = _config(hpl_env, max_steps=6)
    assert submit(cfg, kill_at=5)[0] == "killed"  # checkpoint-4 of a run to 6
    checkpoints = cfg.paths.checkpoints_dir
    assert run_state.mark_if_finished(checkpoints) is None and run_state.read_finished(checkpoints) is None
    assert submit(_config(hpl_env, max_steps=4))[0] == "refused"  # checkpoint-4 trained with max_steps 6
    assert run_state.read_finished(checkpoints) is None
    assert submit(cfg)[0] == "trained"
    record = run_state.checkpoint_record(checkpoints / "checkpoint-6")
    assert run_state.read_finished(checkpoints).trained_from == record
    assert record.inputs["model weights"] and record.learned["train"]["max_steps"] == 6


def test_refilled_model_weights_are_refused_naming_them(hpl_env, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(hpl_env["HPL_MODELS_DIR"], models)
    cfg = _config({**hpl_env, "HPL_MODELS_DIR": str(models)}, max_steps=4)
    assert submit(cfg)[0] == "trained"
    tiny_model.write_tiny_model(models / "tiny-llama", seed=1)  # other weights in the same folder
    with pytest.raises(run_state.RunStateError, match=r"model weights \(the weight files and config\.json in"):
        records = train.read_run(cfg, "torch")
        run_state.run_in_state(records.end, records.plan, StandInEngine(cfg, {}))
