"""A DPO run started from another run's merged model (train.init_from) on CPU: it trains on the tiny model, resumes
from a checkpoint exactly as the uninterrupted run went on, refuses to resume once the init run's weights changed,
and its evaluate step reports the held-out pairs' preference and reward figures; dpo.reference = "precomputed" and
the dora and qlora methods train too."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import config, consolidate, evaluate, merge, train
from llm_pipeline.jobs.run_config_text import set_key
from llm_pipeline.run_files import ProgressLine
from llm_pipeline.run_inputs import input_digests
from tools import tiny_model as tiny

pytestmark = pytest.mark.engine

DPO_TRAIN = {"objective": "dpo", "init_from": "sft", "max_steps": 6, "save_steps": 3, "logging_steps": 1}
PAIRS_DATA = {"packing": False, "validation_fraction": 0.25}


def dpo_env(folder, models) -> dict[str, str]:
    return {"HPL_MODELS_DIR": str(models), "HPL_DATASETS_DIR": str(folder), "HPL_OUTPUTS_DIR": str(folder / "outputs")}


def finished_sft_run(outputs, models):
    """A run folder beside the DPO run's whose merged/ holds a model (the tiny one: what a merge step writes)."""
    shutil.copytree(models / "tiny-llama", outputs / "sft" / "merged")


def dpo_config(folder, env, **train_keys):
    pairs = tiny.write_preference_jsonl(folder / "pairs.jsonl", 24)
    keys = {"train": {**DPO_TRAIN, **train_keys}, "data": {**PAIRS_DATA, "dataset": str(pairs)}}
    raw = write_config(folder / "dpo.toml", env, **keys)
    raw.write_text(set_key(raw.read_text(), "paths", "model_dir", None))  # train.init_from sets paths.model_dir
    return raw, config.load(raw)


def run_train(path, *extra) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train.main(["--prepare-data", "--config", str(path), *extra]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, tiny_models_dir):
    """(config file, config, stdout) of one uninterrupted 6-step DPO run from the run "sft"'s merged model."""
    folder = tmp_path_factory.mktemp("dpo-run")
    env = dpo_env(folder, tiny_models_dir)
    finished_sft_run(folder / "outputs", tiny_models_dir)
    path, cfg = dpo_config(folder, env)
    return path, cfg, run_train(path)


def logged(text: str, steps) -> list[tuple[int, float, float]]:
    return [(line.step, line.loss, line.learning_rate) for line in ProgressLine.parse_all(text) if line.step in steps]


def test_the_run_starts_from_the_named_runs_merged_model_and_records_its_digest(dpo_run, tiny_models_dir):
    path, cfg, out = dpo_run
    init = path.parent / "outputs" / "sft"
    assert (cfg.train.init_from, cfg.paths.model_dir) == (str(init), str(init / "merged"))
    assert "reference: the policy with its adapter disabled" in out and "finished at step 6" in out
    record = json.loads((cfg.paths.checkpoints_dir / "checkpoint-6" / "trained_from.json").read_text())
    assert record["inputs"]["model weights"] == input_digests(cfg, ["model weights"])["model weights"] != ""
    assert record["learned"]["train"]["init_from"] == str(init)


def test_resuming_from_a_checkpoint_goes_on_as_the_uninterrupted_run_did(dpo_run, tmp_path, tiny_models_dir):
    env = dpo_env(tmp_path, tiny_models_dir)
    finished_sft_run(tmp_path / "outputs", tiny_models_dir)
    path, cfg = dpo_config(tmp_path, env, stop_after_step=3)
    first = run_train(path)
    assert "step 3/6" in first and "step 4/6" not in first
    resumed = run_train(*_without_stop(path))
    assert f"resuming from {cfg.paths.checkpoints_dir / 'checkpoint-3'}" in resumed
    # the same pairs in the same order, the same schedule: steps 4-6 as the uninterrupted run logged them
    assert logged(resumed, (4, 5, 6)) == logged(dpo_run[2], (4, 5, 6)) != []
    assert logged(first, (1, 2, 3)) == logged(dpo_run[2], (1, 2, 3))

    # the init run's merged model changed (merged again, from other weights): resuming from it is refused
    (cfg.paths.checkpoints_dir / "checkpoint-6").rename(cfg.paths.checkpoints_dir / "moved")
    (cfg.paths.checkpoints_dir / "finished.json").unlink()
    tiny.write_tiny_model(tmp_path / "outputs" / "sft" / "merged", seed=1)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert train.main(["--config", str(path)]) != 0
    assert "model weights" in err.getvalue() and "checkpoint-3" in err.getvalue(), err.getvalue()


def _without_stop(path):
    from llm_pipeline.jobs.run_config_text import set_key

    path.write_text(set_key(path.read_text(), "train", "stop_after_step", None))
    return (path,)


def test_consolidate_merge_and_evaluate_report_the_held_out_preferences(dpo_run):
    path, cfg, _ = dpo_run
    for step in (consolidate, merge, evaluate):
        with contextlib.redirect_stdout(io.StringIO()):
            assert step.main(["--config", str(path)]) == 0
    tuned = (cfg.paths.merged_dir / "model.safetensors").read_bytes()
    assert tuned != (path.parent / "outputs" / "sft" / "merged" / "model.safetensors").read_bytes()
    result = json.loads((cfg.paths.eval_dir / evaluate.EVAL_JSON).read_text())
    assert result["held_out_rows"] == 6 and {"reward_accuracy", "reward_margin"} <= result.keys()
    for model in ("base", "tuned"):
        assert set(result[model]) >= {"preference_accuracy", "logp_margin"} and "validation_loss" not in result[model]
    # DPO pushes the chosen answers up against the rejected ones, relative to the base it started from
    assert result["reward_margin"] > 0 and result["tuned"]["logp_margin"] > result["base"]["logp_margin"]
    report = (cfg.paths.eval_dir / evaluate.REPORT).read_text()
    assert "| model | preference accuracy | log-probability margin |" in report
    assert f"DPO reward accuracy {result['reward_accuracy']:.3f}" in report
    assert result["answers"][0]["reference"] and result["answers"][0]["tuned"]


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ({"dpo": {"reference": "precomputed"}}, "log-probabilities computed once before training"),
        ({"train": {"method": "dora"}}, "method dora: 17,408 trainable parameters"),
        ({"train": {"method": "qlora"}}, "method qlora: 16,384 trainable parameters"),
    ],
)
def test_a_short_run_with_each_reference_and_adapter_method_trains(keys, line, hpl_env, tmp_path):
    pairs = tiny.write_preference_jsonl(tmp_path / "pairs.jsonl", 12)
    train_keys = {"objective": "dpo", "max_steps": 2, "save_steps": 2, "logging_steps": 1, **keys.get("train", {})}
    sections = {"data": {"packing": False, "validation_fraction": 0.0, "dataset": str(pairs)}, "train": train_keys}
    if "dpo" in keys:
        sections["dpo"] = keys["dpo"]
    path = write_config(tmp_path / "run.toml", hpl_env, **sections)
    out = run_train(path)
    assert line in out and "finished at step 2" in out
    assert all(line.loss == line.loss for line in ProgressLine.parse_all(out))  # not NaN
    assert tiny_config(hpl_env, **sections).train.objective == "dpo"


def test_the_estimate_counts_a_dpo_epoch_in_pairs_from_the_data_steps_report(dpo_run):
    import dataclasses

    from llm_pipeline.jobs import estimate

    _, cfg, _ = dpo_run
    by_epochs = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=-1, epochs=2.0))
    steps, basis = estimate.long_steps(by_epochs, cfg.paths.checkpoints_dir.parent, "train")
    # 24 pairs, 6 held out: 18 pairs of 4 a step, one replica
    assert (steps, basis.split(" (")[0]) == (10, "train.epochs 2 x 5 steps per epoch on 1 data-parallel replica(s)")
