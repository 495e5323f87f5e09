"""The ladder's own steps on real files: the tokenizer fetch, the dataset staging, a rung's job file, the
report from logs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_download_step import fake_hub  # noqa: F401  (the local Hub stand-in, a fixture)

from llm_pipeline import config, pretrain
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import pipeline_status
from llm_pipeline.training.torchtitan import dataset as pretrain_dataset
from llm_pipeline.training.torchtitan import ladder as torchtitan_ladder
from tools import tiny_model as tiny

TINY_LADDER = Path(__file__).resolve().parents[2] / "payloads" / "configs" / "tiny-ladder-cpu.toml"
LINE = (
    "[titan] 2026-01-01 00:00:{step:02d},000 - root - INFO - step: {step:2}  loss: {loss:8.5f}  grad_norm:  1.0000  "
    "memory: 60.00GiB(75.00%)  tps: {tps:,}  tflops: 300.00  mfu: 30.00%"
)


@pytest.fixture
def ladder_config(tmp_path) -> config.RunConfig:
    env = {name: str(tmp_path / name) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    return config.load(TINY_LADDER, env=env)


def test_tokenizer_of_a_gated_model_needs_a_token(fake_hub, ladder_config, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    cfg = dataclasses.replace(ladder_config, model=dataclasses.replace(ladder_config.model, id="org/gated-model"))
    with pytest.raises(StepError, match="org/gated-model is a gated model and no Hugging Face token"):
        pretrain.fetch_tokenizer(cfg, endpoint=fake_hub)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub)  # the step reads the mirror from the environment too
    with pytest.raises(StepError, match=r"org/private-model not found or not accessible"):
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, id="org/private-model"))
        pretrain.fetch_tokenizer(cfg)


def test_tokenizer_already_in_place_is_not_fetched(ladder_config, capsys):
    tiny.build_tokenizer().save_pretrained(ladder_config.paths.model_dir)
    # An endpoint nobody listens on: any Hub access would fail the step.
    pretrain.fetch_tokenizer(ladder_config, endpoint="http://127.0.0.1:9")
    assert "already holds the tokenizer" in capsys.readouterr().out


def test_job_step_refuses_a_rung_the_run_does_not_climb(ladder_config):
    cfg = dataclasses.replace(ladder_config, torchtitan=dataclasses.replace(ladder_config.torchtitan, rungs=("fp8",)))
    with pytest.raises(StepError, match=r"rung 'baseline' is not in torchtitan.rungs \(fp8\)"):
        pretrain.write_job(cfg, "baseline")
    assert pretrain.main(["job", "--config", str(TINY_LADDER)]) == 2  # no --rung: a clear error, exit 2


def test_report_reads_the_recorded_rung_logs_and_says_what_is_missing(ladder_config, capsys):
    logs = Path(ladder_config.paths.logs_dir)
    logs.mkdir(parents=True)
    jobs = []
    for number, rung in enumerate(("baseline", "compile"), 1):
        log = logs / f"rung-{rung}-{number}.log"
        log.write_text("\n".join(LINE.format(step=s, loss=9 - s / 10, tps=1000 * number + s) for s in (1, 10, 20)))
        jobs.append(pipeline_status.StepJob(f"rung-{rung}", str(number), str(log)))
    (logs / "rung-compile-0.log").write_text("an older, unrecorded submission\n")
    pipeline_status.write_record(logs, TINY_LADDER, jobs)

    json_path, md_path = pretrain.report(ladder_config)
    rows = {row["rung"]: row for row in json.loads(json_path.read_text())["rungs"]}
    # medians over steps 10 and 20 (step 1 is warm-up); the recorded log, not the newer-named stray one
    assert rows["compile"]["measured"]["tps"] == 2015 and rows["compile"]["log"].endswith("rung-compile-2.log")
    assert rows["compile"]["tps_vs_baseline"] == pytest.approx(2015 / 1015)
    assert rows["fp8"]["measured"] is None and rows["fp8"]["log"] is None
    assert "fp8: no metric lines (no log)" in capsys.readouterr().out
    assert md_path.read_text().count("not measured: no metric lines in no log") == 2


def test_report_without_any_metric_line_fails_the_step(ladder_config):
    with pytest.raises(StepError, match="no rung logged a torchtitan metric line"):
        pretrain.report(ladder_config)


def save_step(cfg: config.RunConfig, rung: str, step: int) -> Path:
    """A complete checkpoint folder as torchtitan leaves it (its .metadata written last)."""
    folder = Path(cfg.paths.output_dir) / "ladder" / rung / "checkpoint" / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"dcp")
    return folder


def test_resubmitted_rung_resumes_or_is_skipped_when_finished(ladder_config, capsys):
    rung_dir = Path(ladder_config.paths.output_dir) / "ladder" / "compile"
    pretrain.write_job(ladder_config, "compile")
    assert not (rung_dir / "skip").exists()
    save_step(ladder_config, "compile", 10)
    pretrain.write_job(ladder_config, "compile")  # stopped at step 10 of 20: torchtitan resumes
    assert "resumes from the newest checkpoint" in capsys.readouterr().out
    assert not (rung_dir / "skip").exists()
    save_step(ladder_config, "compile", 20)
    pretrain.write_job(ladder_config, "compile")
    assert "finished earlier with this job file" in capsys.readouterr().out
    assert (rung_dir / "skip").is_file()  # ladder-rung.sbatch stops before torchrun
    (Path(ladder_config.paths.output_dir) / "ladder" / "compile" / "checkpoint").rename(rung_dir / "old")
    pretrain.write_job(ladder_config, "compile")
    assert not (rung_dir / "skip").exists()  # checkpoints gone: trained again


def test_checkpoints_from_another_job_file_are_never_resumed(ladder_config):
    pretrain.write_job(ladder_config, "baseline")
    save_step(ladder_config, "baseline", 20)
    longer = dataclasses.replace(ladder_config, torchtitan=dataclasses.replace(ladder_config.torchtitan, steps=40))
    with pytest.raises(StepError, match=r"rung baseline has checkpoints in .*checkpoint from a different job file"):
        pretrain.write_job(longer, "baseline")


def test_report_of_a_skipped_rung_reads_its_earlier_log(ladder_config):
    logs = Path(ladder_config.paths.logs_dir)
    logs.mkdir(parents=True)
    earlier = logs / "rung-baseline-1.log"
    earlier.write_text("\n".join(LINE.format(step=s, loss=5.0, tps=900) for s in (1, 10, 20)))
    skipped = logs / "rung-baseline-7.log"
    skipped.write_text("rung baseline: finished earlier with the same job file; not trained again\n")
    pipeline_status.write_record(logs, TINY_LADDER, [pipeline_status.StepJob("rung-baseline", "7", str(skipped))])
    assert pretrain.rung_log(ladder_config, "baseline") == earlier
    earlier.unlink()
    assert pretrain.rung_log(ladder_config, "baseline") == skipped  # then it says: no metric lines there


def staged_config(cfg: config.RunConfig, source: Path) -> config.RunConfig:
    return dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, dataset_source=str(source)))


def test_dataset_is_staged_once_with_its_card_and_read_as_torchtitan_reads_c4(ladder_config, tmp_path, capsys):
    source = tiny.write_c4_folder(tmp_path / "source", shards=2)
    (source / "en" / "c4-train.00000-of-00002.json.gz.lock").write_text("not data")  # matches no pattern
    cfg = staged_config(ladder_config, source)
    target = pretrain_dataset.stage(cfg)
    assert target == Path(cfg.torchtitan.dataset_dir)
    out = capsys.readouterr().out
    assert "staged 3 data files" in out and "first record:" in out  # 2 train + 1 validation shard
    record = json.loads((target / ".staged.json").read_text())
    assert record["files"][0] == "README.md" and not any(name.endswith(".lock") for name in record["files"])
    # every rung reads the staged copy
    assert torchtitan_ladder.compose(cfg, "baseline")["training"]["dataset_path"] == str(target)

    pretrain_dataset.stage(cfg)
    assert "not staged again" in capsys.readouterr().out
    (target / "en" / "c4-validation.00000-of-00001.json.gz").unlink()  # incomplete: staged again
    pretrain_dataset.stage(cfg)
    assert "staged 3 data files" in capsys.readouterr().out


def test_a_dataset_without_its_card_or_files_is_refused(ladder_config, tmp_path):
    no_card = tiny.write_c4_folder(tmp_path / "no-card", card=False)
    with pytest.raises(StepError, match=r"has no README.md \(its dataset card\)"):
        pretrain_dataset.stage(staged_config(ladder_config, no_card))
    empty = tmp_path / "empty"
    (empty / "README.md").parent.mkdir()
    (empty / "README.md").write_text(tiny.C4_CARD)
    cfg = staged_config(ladder_config, empty)
    cfg = dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, dataset_dir=str(tmp_path / "c4-2")))
    with pytest.raises(StepError, match=r"torchtitan.dataset_files .* match no file of"):
        pretrain_dataset.stage(cfg)


def test_without_a_dataset_source_nothing_is_staged_and_rungs_stream(ladder_config, capsys):
    cfg = staged_config(ladder_config, "")
    assert pretrain_dataset.stage(cfg) is None and "no staging" in capsys.readouterr().out
    assert "dataset_path" not in torchtitan_ladder.compose(cfg, "baseline")["training"]


def test_a_rung_stopped_early_saves_a_full_checkpoint_on_the_whole_schedule_and_resumes(ladder_config, capsys):
    stopping = torchtitan_ladder.stopping_at(ladder_config, 4)
    job = torchtitan_ladder.compose(stopping, "fp8_allgather")
    assert job["training"]["steps"] == 4 and job["lr_scheduler"]["total_steps"] == ladder_config.torchtitan.steps
    assert job["checkpoint"]["last_save_model_only"] is False  # the stop's save holds the optimizer too
    whole = torchtitan_ladder.compose(ladder_config, "fp8_allgather")
    assert "total_steps" not in whole.get("lr_scheduler", {}) and whole["training"]["steps"] == 20
    pretrain.write_job(stopping, "fp8_allgather")
    save_step(ladder_config, "fp8_allgather", 4)
    pretrain.write_job(stopping, "fp8_allgather")  # the stopped job resubmitted: done
    assert "finished earlier with this job file" in capsys.readouterr().out
    pretrain.write_job(ladder_config, "fp8_allgather")  # the whole job goes on from the stop's checkpoint
    out = capsys.readouterr().out
    assert "resumes from the newest checkpoint" in out and "finished earlier" not in out
    longer = dataclasses.replace(ladder_config, torchtitan=dataclasses.replace(ladder_config.torchtitan, steps=40))
    with pytest.raises(StepError, match="from a different job file"):  # another schedule: still refused
        pretrain.write_job(longer, "fp8_allgather")
