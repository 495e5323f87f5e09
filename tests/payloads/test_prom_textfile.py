"""The run's figures for node exporter's textfile collector: the real MetricsLogger writes them, atomically,
with run and Slurm job labels, NaN as NaN; nothing is written where the node has no metrics folder."""

from __future__ import annotations

import math

from transformers import TrainerState, TrainingArguments

from llm_pipeline.jobs import prom_textfile
from llm_pipeline.run_files import EventLine, MetricsTextfile, metric_value
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter


def parse(text: str) -> dict[str, tuple[str, str, float]]:
    """name -> (run, slurm job id, value), read through the format's owner (it refuses a line that is no sample)."""
    found = {}
    for sample in MetricsTextfile.parse(text).samples:
        labels = dict(sample.labels)
        assert set(labels) == {"run", "slurm_job_id"}, sample
        found[sample.name] = (labels["run"], labels["slurm_job_id"], sample.value)
    return found


def log_steps(tmp_path, losses: list[float]) -> None:
    run_dir = tmp_path / "runs" / "lora-demo"
    args = TrainingArguments(output_dir=str(run_dir / "checkpoints"), per_device_train_batch_size=2, report_to="none")
    state = TrainerState(max_steps=10, is_world_process_zero=True)
    tokens = TokenCounter(lambda features: features)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    logger.on_train_begin(args, state, None)
    for done, loss in enumerate(losses, start=1):
        logger.last_time -= 2.0
        tokens.real += 1000
        state.global_step = done
        logger.on_log(args, state, None, logs={"loss": loss, "learning_rate": 2e-4, "mfu": 0.41})


def test_the_metrics_logger_publishes_each_log_event(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "textfile"
    folder.mkdir()
    monkeypatch.setenv(prom_textfile.FOLDER_ENV, str(folder))
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    log_steps(tmp_path, [2.5, 2.0])

    assert sorted(p.name for p in folder.iterdir()) == ["hpl_run_4711.prom"]  # no temporary file left
    series = parse((folder / "hpl_run_4711.prom").read_text())
    assert {labels[:2] for labels in series.values()} == {("lora-demo", "4711")}
    values = {name: value for name, (_, _, value) in series.items()}
    assert (values["hpl_train_loss"], values["hpl_train_step"], values["hpl_train_max_steps"]) == (2.0, 2, 10)
    assert values["hpl_train_learning_rate"] == 2e-4 and values["hpl_train_mfu_ratio"] == 0.41
    assert 400 < values["hpl_train_tokens_per_second"] < 600  # 1000 tokens in about 2 s, one replica
    assert 0 < values["hpl_train_eta_seconds"] < 60  # 8 steps left at about 2 s each
    assert "step 2/10 | loss 2.0000" in capsys.readouterr().out  # the progress line is unchanged


def test_nan_is_written_as_nan(tmp_path, monkeypatch):
    monkeypatch.setenv(prom_textfile.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    log_steps(tmp_path, [float("nan")])

    text = (tmp_path / "hpl_run_7.prom").read_text()
    assert 'hpl_train_loss{run="lora-demo",slurm_job_id="7"} NaN\n' in text
    assert math.isnan(parse(text)["hpl_train_loss"][2])
    assert metric_value(float("inf")) == "+Inf" and metric_value(-float("inf")) == "-Inf"


def test_an_event_without_a_loss_prints_its_figures_and_publishes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(prom_textfile.FOLDER_ENV, str(tmp_path))
    args = TrainingArguments(output_dir=str(tmp_path / "run" / "checkpoints"), report_to="none")
    state = TrainerState(max_steps=10, global_step=10, is_world_process_zero=True)
    logger = MetricsLogger(tokens=TokenCounter(lambda features: features), trainable=1, tensorboard_dir=None)
    logger.on_train_begin(args, state, None)
    logger.on_log(args, state, None, logs={"eval_loss": float("nan"), "epoch": 3.0})
    (line,) = [found for row in capsys.readouterr().out.splitlines() if (found := EventLine.parse(row))]
    assert (line.step, line.total, line.figures[1]) == (10, 10, ("epoch", 3.0)) and math.isnan(line.figures[0][1])
    assert list(tmp_path.glob("*.prom")) == []


def test_labels_are_escaped():
    text = prom_textfile.render({"step": 1}, run='a"b\\c', job_id="1")
    assert 'run="a\\"b\\\\c"' in text
    assert parse(text)["hpl_train_step"][0] == 'a"b\\c'


def test_no_folder_no_file(tmp_path, monkeypatch):
    monkeypatch.delenv(prom_textfile.FOLDER_ENV, raising=False)
    assert prom_textfile.publish({"step": 1}, run="r") is None
    assert prom_textfile.publish({"step": 1}, run="r", environ={prom_textfile.FOLDER_ENV: str(tmp_path / "no")}) is None


def test_a_failed_write_is_a_warning(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "readonly"
    folder.mkdir()
    monkeypatch.setenv(prom_textfile.FOLDER_ENV, str(folder))
    monkeypatch.setattr(prom_textfile.tempfile, "mkstemp", lambda **_: (_ for _ in ()).throw(OSError("disk full")))
    assert prom_textfile.publish_event({"loss": 1.0}, step=1, max_steps=2, eta_seconds=1.0, run="r") is None
    assert "warning: the run's metrics were not written for node exporter: disk full" in capsys.readouterr().out


def test_grpo_figures_are_published_with_one_series_per_reward_function(tmp_path, monkeypatch):
    monkeypatch.setenv(prom_textfile.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    logs = {"loss": 0.1, "reward": 1.25, "kl": 0.02, "completions/mean_length": 3.5}
    logs |= {"rewards/format/mean": 0.75, "rewards/exact_match/mean": 0.5, "rewards/format/std": 0.4}
    prom_textfile.publish_event(logs, step=3, max_steps=10, eta_seconds=1.0, run="grpo-demo")

    text = (tmp_path / "hpl_run_9.prom").read_text()
    samples = MetricsTextfile.parse(text).samples
    values = {(s.name, dict(s.labels).get("function")): s.value for s in samples}
    assert values[("hpl_train_reward", None)] == 1.25 and values[("hpl_train_kl", None)] == 0.02
    assert values[("hpl_train_completion_length", None)] == 3.5
    assert values[("hpl_train_reward_function", "format")] == 0.75
    assert values[("hpl_train_reward_function", "exact_match")] == 0.5
    assert len(samples) == len(values)  # a std is not a series
    assert text.count("# HELP hpl_train_reward_function ") == 1  # one family, however many functions
