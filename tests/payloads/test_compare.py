"""compare and the charts on metrics written the way each backend writes them: TensorBoard events
through the trainers' own MetricsLogger, their progress lines, torchtitan's metric lines. Charts are
read back: the PNG (size, not blank) and the data on the figure's axes."""

from __future__ import annotations

import json

import pytest
from chart_checks import line_data, read_png
from transformers import TrainerState, TrainingArguments

from llm_pipeline import charts, compare, run_metrics
from llm_pipeline.run_files import ProgressLine
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter

LOSSES = [2.0, 1.8, 1.65, 1.55, 1.5, 1.46, 1.43, 1.41]


def write_run(folder, losses, *, batch=4, length=128, first_step=1, log_line=False, rates=None):
    """A run folder whose tensorboard/ holds what MetricsLogger writes for these losses (one per step) and
    learning rates (default: 1e-4 at every step)."""
    args = TrainingArguments(output_dir=str(folder / "unused"), per_device_train_batch_size=batch, report_to="none")
    state = TrainerState(max_steps=first_step + len(losses) - 1, is_world_process_zero=True)
    state.global_step = first_step - 1
    logger = MetricsLogger(
        tokens=TokenCounter(lambda f: f), trainable=1, sequence_length=length, tensorboard_dir=folder / "tensorboard"
    )
    logger.on_train_begin(args, state, None)
    for index, (step, loss) in enumerate(enumerate(losses, first_step)):
        state.global_step = step
        logger.on_log(args, state, None, logs={"loss": loss, "learning_rate": rates[index] if rates else 1e-4})
    logger.on_train_end(args, state, None)
    return folder


def test_events_give_the_curve_and_tokens_per_step(tmp_path):
    (curve,) = run_metrics.read_run(write_run(tmp_path / "a", LOSSES, batch=4, length=128))
    assert curve.kind == "events" and curve.steps == tuple(range(1, 9))
    assert curve.losses == pytest.approx(LOSSES)
    assert curve.tokens_per_step == 4 * 128 and curve.tokens[-1] == 8 * 512


def test_a_restarted_run_keeps_the_newest_value_of_each_step(tmp_path):
    run = write_run(tmp_path / "a", LOSSES[:6])
    write_run(run, [9.0, 8.0, 7.0], first_step=5)  # resumed from step 4: steps 5-7 again
    (curve,) = run_metrics.read_run(run)
    assert curve.steps == tuple(range(1, 8)) and curve.losses[3:] == pytest.approx([LOSSES[3], 9.0, 8.0, 7.0])


def test_matching_runs_pass_and_a_perturbed_run_fails_with_the_numbers(tmp_path, capsys):
    reference = write_run(tmp_path / "fp32", LOSSES)
    close = write_run(tmp_path / "bf16", [v * (1.004 if i % 2 else 0.997) for i, v in enumerate(LOSSES)])
    far = write_run(tmp_path / "lr-x3", [v * (1 - 0.01 * i) for i, v in enumerate(LOSSES)])
    out = tmp_path / "cmp"
    assert compare.main([str(reference), str(close), "--output", str(out), "--tolerance", "0.01"]) == 0
    assert compare.main([str(reference), str(close), str(far), "--output", str(out), "--tolerance", "0.01"]) == 1
    result = json.loads((out / "compare.json").read_text())
    rows = {row["label"]: row for row in result["runs"]}
    assert result["verdict"] == "no match" and rows["fp32"]["reference"]
    assert rows["bf16"]["matches"] and rows["bf16"]["max_relative_difference"] == pytest.approx(0.004, rel=1e-3)
    assert not rows["lr-x3"]["matches"] and rows["lr-x3"]["max_relative_difference"] == pytest.approx(0.07, rel=1e-3)
    assert rows["lr-x3"]["mean_relative_difference"] == pytest.approx(0.035, rel=1e-3)
    table = (out / "compare.md").read_text()
    assert "| lr-x3 |" in table and "| 7.00% | 3.50% | **no** |" in table and "Verdict: **no match**" in table
    # the chart: the three curves on the top axis, the two differences and the tolerance below
    read_png(out / "compare.png", rows=2)
    curves = [c for run in (reference, close, far) for c in run_metrics.read_run(run)]
    figure = compare.figure(curves, compare.differences(curves, by="step", steps=None), by="step", tolerance=0.01)
    top, bottom = figure.axes
    assert line_data(top)["fp32"] == [(s, pytest.approx(v)) for s, v in enumerate(LOSSES, 1)]
    assert top.get_xlabel() == "optimizer step" and top.get_ylabel() == "training loss"
    below = line_data(bottom)
    assert below["lr-x3"][-1] == (8, pytest.approx(7.0)) and below["tolerance 1.0%"][0][1] == pytest.approx(1.0)


def test_window_and_tokens_alignment_across_batch_sizes(tmp_path):
    linear = [2.0 - 0.05 * step for step in range(1, 9)]  # so interpolating between logged points is exact
    reference = write_run(tmp_path / "gpu", linear, batch=4)  # 512 tokens per step
    # twice the batch: its step s saw the tokens of the reference's step 2s
    doubled = write_run(tmp_path / "trn", [linear[2 * s - 1] for s in range(1, 5)], batch=8)
    by_step = compare.compare([reference, doubled], tmp_path / "s", by="step", tolerance=0.01)
    assert by_step["verdict"] == "no match"
    by_tokens = compare.compare([reference, doubled], tmp_path / "t", by="tokens", tolerance=0.01)
    assert by_tokens["verdict"] == "match" and by_tokens["runs"][1]["points_compared"] == 7  # 1024..4096 tokens
    windowed = compare.compare([reference, doubled], tmp_path / "w", by="tokens", steps=4, tolerance=0.01)
    assert windowed["runs"][1]["points_compared"] == 3
    read_png(tmp_path / "t" / "compare.png", rows=2)


def test_progress_logs_and_torchtitan_ladders_are_read_too(tmp_path):
    run = tmp_path / "neuron-run" / "logs"
    run.mkdir(parents=True)
    lines = [ProgressLine(s, 8, v, 1e-5, 3.0, 100.0, "0:00:01").format() for s, v in enumerate(LOSSES, 1)]
    (run / "train-12.log").write_text("\n".join(lines) + "\n")
    ladder = tmp_path / "ladder-run" / "logs"
    ladder.mkdir(parents=True)
    for job, rung, scale in ((40, "baseline", 1.0), (41, "fp8", 1.002)):
        text = "".join(
            f"[titan] 2026 - root - INFO - step: {s}  loss: {v * scale:.5f}  grad_norm:  1.0  memory: 1.00GiB(1.00%)"
            f"  tps: 1,000  tflops: 1.0  mfu: 1.00%\n"
            for s, v in enumerate(LOSSES, 1)
            for _rank in range(2)
        )
        (ladder / f"rung-{rung}-{job}.log").write_text(text)
    result = compare.compare([tmp_path / "neuron-run", tmp_path / "ladder-run"], tmp_path / "c", tolerance=0.01)
    assert [row["label"] for row in result["runs"]] == ["neuron-run", "ladder-run:baseline", "ladder-run:fp8"]
    assert [row["kind"] for row in result["runs"]] == ["progress log", "torchtitan log", "torchtitan log"]
    assert result["verdict"] == "match" and result["runs"][2]["max_relative_difference"] == pytest.approx(
        0.002, abs=1e-4
    )


def test_evaluation_numbers_appear_beside_the_curve(tmp_path):
    run = write_run(tmp_path / "tuned", LOSSES)
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text(json.dumps({
        "base": {"validation_loss": 2.5, "perplexity": 12.18}, "tuned": {"validation_loss": 1.5, "perplexity": 4.48},
    }))  # fmt: skip
    compare.compare([run, write_run(tmp_path / "again", LOSSES)], tmp_path / "c")
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "**match**" in table and "| 2.5000 / 12.18 | 1.5000 / 4.48 |" in table


def test_one_run_is_no_comparison(tmp_path, capsys):
    run = write_run(tmp_path / "alone", LOSSES)
    assert compare.main([str(run), "--output", str(tmp_path / "c")]) == 2
    assert "holds one loss curve: compare needs two or more (its own chart is <run>/eval/result.png)" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "c").exists()


def test_a_run_has_one_chart_with_its_loss_base_and_tuned_validation_loss_and_learning_rate(tmp_path):
    from types import SimpleNamespace

    from llm_pipeline import evaluate

    rates = [1e-4 * (len(LOSSES) - i) / len(LOSSES) for i in range(len(LOSSES))]  # a linear decay
    run = write_run(tmp_path / "tuned", LOSSES, rates=rates)
    cfg = SimpleNamespace(paths=SimpleNamespace(output_dir=str(run)))
    scores = {"base": {"validation_loss": 2.5}, "tuned": {"validation_loss": 1.5}}
    figure = evaluate.result_figure(cfg, scores)
    loss_axis, rate_axis = figure.axes
    drawn = line_data(loss_axis)
    assert drawn["training loss"] == [(float(s), pytest.approx(v)) for s, v in enumerate(LOSSES, 1)]
    assert {y for _, y in drawn["base validation loss 2.5000"]} == {2.5}
    assert {y for _, y in drawn["tuned validation loss 1.5000"]} == {1.5}
    assert [y for _, y in line_data(rate_axis)["lr"]] == pytest.approx(rates)
    charts.save(figure, tmp_path / "result.png")
    read_png(tmp_path / "result.png", rows=2)


def test_bad_input_names_the_run_and_the_fix(tmp_path, capsys):
    assert compare.main([str(tmp_path / "missing"), "--output", str(tmp_path / "c")]) == 2
    assert "run " + str(tmp_path / "missing") + " does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert compare.main([str(tmp_path / "empty"), "--output", str(tmp_path / "c")]) == 2
    assert "has no loss to read" in capsys.readouterr().err
    a = write_run(tmp_path / "a", LOSSES)
    (tmp_path / "b" / "logs").mkdir(parents=True)
    (tmp_path / "b" / "logs" / "train-1.log").write_text(ProgressLine(3, 8, 1.0, 1e-5, 3.0, 100.0, "0:00:05").format())
    assert compare.main([str(a), str(tmp_path / "b"), "--output", str(tmp_path / "c"), "--by", "tokens"]) == 2
    assert "does not record tokens per step" in capsys.readouterr().err


def test_scaling_and_ladder_figures_carry_their_report_data():
    sweep = {
        "plan": {"base": {"method": "full"}},
        "rows": [
            {"nodes": n, "sequences_per_second": s, "reference_sequences_per_second": r, "backend": "neuron"}
            for n, s, r in ((1, 3.5, 3.7), (2, 6.8, 7.4), (4, 13.0, 14.6))
        ],
    }
    (axis,) = charts.sweep_figure(sweep).axes
    lines = line_data(axis)
    assert lines["measured"] == [(1, 3.5), (2, 6.8), (4, 13.0)]
    assert lines["linear scaling"] == [(1, 3.5), (2, 7.0), (4, 14.0)]
    assert lines["reference (published)"] == [(1, 3.7), (2, 7.4), (4, 14.6)]
    assert axis.get_xlabel() == "nodes" and axis.get_ylabel() == "sequences/s"
    ladder = {
        "steps_per_rung": 20,
        "rungs": [
            {"title": "baseline", "measured": {"tps": 1000.0}, "reference_tps": 6000},
            {"title": "fp8", "measured": None, "reference_tps": 8000},
        ],
    }
    (axis,) = charts.ladder_figure(ladder).axes
    assert [round(bar.get_height()) for bar in axis.patches] == [1000, 6000, 8000]  # no bar for a missing rung
    assert [t.get_text() for t in axis.get_xticklabels()] == ["baseline", "fp8"]
    assert axis.get_yscale() == "linear"
    cpu_rehearsal = {
        "steps_per_rung": 4,
        "rungs": [{"title": "baseline", "measured": {"tps": 40.0}, "reference_tps": 6000}],
    }
    (axis,) = charts.ladder_figure(cpu_rehearsal).axes
    assert axis.get_yscale() == "log", "a measured bar 150x below the reference stays visible"
    assert [round(bar.get_height()) for bar in axis.patches] == [40, 6000]


def test_benchmark_figure_has_a_bar_per_variant_and_every_timed_step():
    variants = [("engine", 210.0, [200.0, 210.0, 220.0]), ("trl-defaults", 130.0, [120.0, 130.0]), ("liger", None, [])]
    (axis,) = charts.benchmark_figure(variants, title="t").axes
    assert [round(bar.get_height()) for bar in axis.patches] == [210, 130]  # nothing for a variant not run
    dots = line_data(axis)
    assert dots["timed steps"] == [(0, 200.0), (0, 210.0), (0, 220.0)]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["engine", "trl-defaults", "liger"]
    noted = charts.benchmark_figure(variants, title="t", note="CPU run: read me")
    assert [text.get_text() for text in noted.texts] == ["CPU run: read me"]
    assert not charts.benchmark_figure(variants, title="t").texts
