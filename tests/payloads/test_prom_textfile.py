"""The run's figures for node exporter's textfile collector: the real MetricsLogger writes them, atomically,
with run and Slurm job labels, NaN as NaN; nothing is written where the node has no metrics folder."""

from __future__ import annotations

import math
import re

from transformers import TrainerState, TrainingArguments

from llm_pipeline.jobs import prom_textfile
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter

SAMPLE = re.compile(r'^(?P<name>hpl_train_\w+)\{run="(?P<run>[^"]*)",slurm_job_id="(?P<job>[^"]*)"\} (?P<value>\S+)$')


def parse(text: str) -> dict[str, tuple[str, str, float]]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        found[match["name"]] = (match["run"], match["job"], float(match["value"]))
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
    assert prom_textfile.sample(float("inf")) == "+Inf" and prom_textfile.sample(-float("inf")) == "-Inf"


def test_labels_are_escaped():
    text = prom_textfile.render({"step": 1}, run='a"b\\c', job_id="1")
    assert 'run="a\\"b\\\\c"' in text


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
