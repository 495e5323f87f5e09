"""The scaling report reads the lines our trainer callback prints, and puts the published Trainium
Llama 2 7B full fine-tuning figures beside a neuron run of that shape (and only there)."""

from __future__ import annotations

import json

import pytest
from chart_checks import line_data, read_png
from transformers import TrainerState, TrainingArguments

from llm_pipeline import charts
from llm_pipeline.jobs import scaling_report
from llm_pipeline.jobs.sweep_plan import PLAN_NAME
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter


def training_log(capsys, tmp_path, backend: str, step_seconds: float, ga: int) -> str:
    """What train prints: its backend line, then MetricsLogger's lines for 3 log events."""
    args = TrainingArguments(output_dir=str(tmp_path / "unused"), per_device_train_batch_size=1,
                             gradient_accumulation_steps=ga, report_to="none")  # fmt: skip
    state = TrainerState(max_steps=6, is_world_process_zero=True)
    tokens = TokenCounter(lambda features: features)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    print(f"training with the {backend} backend, from the base model")
    logger.on_train_begin(args, state, None)
    for step in (2, 4, 6):
        logger.last_time -= step_seconds * 2  # two optimizer steps took this long
        tokens.real += 1000
        state.global_step = step
        logger.on_log(args, state, None, logs={"loss": 2.0 / step, "learning_rate": 1e-5})
    return capsys.readouterr().out


LLAMA2_7B_FULL = {"model_id": "meta-llama/Llama-2-7b-hf", "method": "full", "max_length": 4096, "model_parallel": 8}


@pytest.mark.parametrize(
    ("backend", "base", "reference"),
    [
        ("neuron", LLAMA2_7B_FULL, True),
        ("torch", LLAMA2_7B_FULL, False),
        ("neuron", {**LLAMA2_7B_FULL, "model_id": "meta-llama/Meta-Llama-3-8B"}, False),  # only Llama 2 7B
        ("neuron", {**LLAMA2_7B_FULL, "max_length": 1024}, False),
    ],
)
def test_the_table_from_logged_lines(tmp_path, capsys, backend, base, reference):
    points = []
    for nodes, ga, seconds in ((1, 4, 2.0), (2, 2, 1.1)):
        folder = tmp_path / f"nodes-{nodes}"
        (folder / "logs").mkdir(parents=True)
        log = training_log(capsys, tmp_path, backend, seconds, 256)  # this process: 256 sequences per step in all
        (folder / "logs" / "train-7.log").write_text(log)
        (folder / "logs" / "train-12.log").write_text(log)  # the newest job's log is read
        points.append({"nodes": nodes, "gradient_accumulation_steps": ga, "global_batch": 256,
                       "config": str(folder / "run.toml"), "output_dir": str(folder)})  # fmt: skip
    plan = {"config": "run.toml", "base": base, "points": points, "jobs": {}}
    (tmp_path / PLAN_NAME).write_text(json.dumps(plan))
    scaling_report.write_report(tmp_path)
    rows = json.loads((tmp_path / "scaling.json").read_text())["rows"]
    assert [r["log"].endswith("train-12.log") for r in rows] == [True, True]
    assert all(r["events"] == 3 and r["backend"] == backend for r in rows)
    # MetricsLogger's samples/s is global batch / step time
    assert rows[0]["sequences_per_second"] == pytest.approx(256 / 2.0, rel=0.05)
    assert rows[1]["seconds_per_step"] == pytest.approx(1.1, rel=0.05)
    assert rows[1]["scaling_efficiency"] == pytest.approx((2.0 / 1.1) / 2, rel=0.05)
    table = (tmp_path / "scaling.md").read_text()
    # the chart beside the table: opened, and its lines are the report's figures
    read_png(charts.scaling_chart(tmp_path))
    lines = line_data(charts.sweep_figure(json.loads((tmp_path / "scaling.json").read_text())).axes[0])
    measured = [r["sequences_per_second"] for r in rows]
    assert lines["measured"] == [(1, measured[0]), (2, measured[1])]
    assert lines["linear scaling"] == [(1, measured[0]), (2, pytest.approx(2 * measured[0]))]
    assert ("reference (published)" in lines) == reference
    if reference:
        assert [r["reference_sequences_per_second"] for r in rows] == [3.7, 7.4]
        assert "published Trainium result: Llama 2 7B full fine-tuning" in table
    else:
        assert all(r["reference_sequences_per_second"] is None for r in rows)
        assert "the smallest run is the baseline" in table


def test_a_point_without_a_training_log_is_named(tmp_path):
    plan = {"config": "run.toml", "base": {"method": "lora"}, "jobs": {},
            "points": [{"nodes": 1, "gradient_accumulation_steps": 1, "global_batch": 1,
                        "config": "x", "output_dir": str(tmp_path / "nodes-1")}]}  # fmt: skip
    (tmp_path / PLAN_NAME).write_text(json.dumps(plan))
    assert scaling_report.main(["--sweep-dir", str(tmp_path)]) == 2
