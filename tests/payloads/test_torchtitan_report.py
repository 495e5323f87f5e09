"""The ladder report reads torchtitan 0.2.2's own metric lines.

The lines under test are printed by torchtitan's MetricsProcessor.log itself (torchtitan_probe.py,
in .venv/torchtitan-site), with and without colors, and compared with the figures torchtitan
computed for them; summaries and the report are checked on logs built from such lines.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
from chart_checks import read_png
from torchtitan_site import probe

from llm_pipeline import charts
from llm_pipeline.run_files import TitanMetricLine, titan_device
from llm_pipeline.training.torchtitan import metrics as torchtitan_metrics
from llm_pipeline.training.torchtitan import report as ladder_report

# Its module fixture runs torchtitan (seconds): one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("torchtitan_report")


@pytest.fixture(scope="module")
def printed():
    return probe("metrics")


def test_parser_reads_back_what_torchtitan_printed_and_computed(printed):
    lines = printed["lines"]
    parsed = TitanMetricLine.parse_all(lines)
    logged = [entry for run in printed["runs"] for entry in run["logged"] if "grad_norm" in entry]
    assert len(parsed) == len(logged) == 4  # 2 steps x (plain, colored); the validation lines are skipped
    assert "validate step: 10" in lines and "\x1b[31mstep:" in lines  # both kinds were really printed
    for line, figures in zip(parsed, logged, strict=True):
        assert line.step == figures["step"]
        assert line.loss == pytest.approx(figures["loss_metrics/global_avg_loss"], abs=5e-6)
        assert line.grad_norm == pytest.approx(figures["grad_norm"], abs=5e-5)
        assert line.memory_gib == pytest.approx(figures["memory/max_reserved(GiB)"], abs=5e-3)
        assert line.memory_pct == pytest.approx(figures["memory/max_reserved(%)"], abs=5e-3)
        assert line.tps == round(figures["throughput(tps)"])
        assert line.tflops == pytest.approx(figures["tflops"], abs=5e-3)
        assert line.mfu == pytest.approx(figures["mfu(%)"], abs=5e-3)


def test_device_line_names_the_gpu():
    text = "[titan] 2026-01-01 00:00:00,000 - root - INFO - CUDA capacity: NVIDIA H100 80GB HBM3 with 79.19GiB memory"
    assert titan_device(text) == "NVIDIA H100 80GB HBM3 (79.19 GiB)"
    assert titan_device("nothing here") == "unknown"


def rank_log(printed_line: str, steps: dict[int, list[tuple[float, int, float]]]) -> str:
    """A job log like a multi-rank run's: one line per rank per logged step, in torchtitan's format
    (the plain line torchtitan printed, with step, loss, tps and memory replaced)."""
    out = ["[titan] 2026-01-01 00:00:00,000 - root - INFO - CUDA capacity: NVIDIA H100 80GB HBM3 with 79.19GiB memory"]
    for step, ranks in steps.items():
        for loss, tps, memory in ranks:
            line = TitanMetricLine.parse(printed_line)
            out.append(dataclasses.replace(line, step=step, loss=loss, tps=tps, memory_gib=memory).format())
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def plain_line(printed):
    return next(line for line in printed["lines"].splitlines() if "step: 10" in line and "\x1b" not in line)


def test_summary_groups_ranks_by_step_and_skips_warm_up(plain_line):
    steps = {1: [(12.0, 900, 40.0), (12.0, 1100, 41.0)]}
    steps |= {s: [(10.0 - s / 100, 6000 + s, 60.0), (10.0 - s / 100, 6100 + s, 61.5)] for s in range(10, 101, 10)}
    summary = torchtitan_metrics.summarize(rank_log(plain_line, steps))
    assert summary.ranks == 2 and summary.lines == 22
    assert summary.steady_steps == tuple(range(20, 101, 10))  # step 1 and the first tenth are warm-up
    assert summary.tps == pytest.approx(statistics.median([6050 + s for s in range(20, 101, 10)]))
    assert (summary.last_step, summary.final_loss, summary.memory_gib) == (100, 9.0, 61.5)
    assert summary.device == "NVIDIA H100 80GB HBM3 (79.19 GiB)"


def test_short_runs_still_summarize_and_an_empty_log_does_not(plain_line):
    only_first = torchtitan_metrics.summarize(rank_log(plain_line, {1: [(11.0, 500, 1.0)]}))
    assert only_first.steady_steps == (1,) and only_first.tps == 500
    two = torchtitan_metrics.summarize(rank_log(plain_line, {1: [(11.0, 500, 1.0)], 5: [(10.0, 700, 1.0)]}))
    assert two.steady_steps == (5,)
    assert torchtitan_metrics.summarize("srun: error: no metric lines at all\n") is None


def test_report_shows_ratios_to_baseline_and_the_reference_beside(plain_line, tmp_path):
    def summary(tps: int):
        return torchtitan_metrics.summarize(rank_log(plain_line, {10: [(3.6, tps, 50.0)], 20: [(3.5, tps, 50.0)]}))

    results = [
        ladder_report.RungResult("baseline", tmp_path / "b.log", summary(1000)),
        ladder_report.RungResult("compile", tmp_path / "c.log", summary(1100)),
        ladder_report.RungResult("fp8", tmp_path / "f.log", summary(1300)),
        ladder_report.RungResult("fp8_allgather", None, None),
    ]
    json_path, md_path = ladder_report.write(results, 20, tmp_path)
    report = json.loads(json_path.read_text())
    rows = {row["rung"]: row for row in report["rungs"]}
    assert rows["compile"]["tps_vs_baseline"] == pytest.approx(1.1)
    assert rows["fp8"]["tps_vs_baseline"] == pytest.approx(1.3)
    assert rows["fp8_allgather"]["measured"] is None and rows["fp8_allgather"]["tps_vs_baseline"] is None
    assert rows["fp8"]["reference_tps"] == 8624
    assert rows["fp8_allgather"]["reference_tps_vs_baseline"] == pytest.approx(8950 / 6475)
    markdown = md_path.read_text()
    assert "| + torch.compile | 1,100 | 1.100 (+10.0 %) |" in markdown
    assert "| + FP8 all-gather, precomputed scales | not measured: no metric lines in no log |" in markdown
    assert "| + torch.compile | 7,166 | 1.107 (+10.7 %) | 3.601 |" in markdown  # the reference, beside
    # the chart beside it: opened, and its bars are the measured and reference tokens/s of each rung
    read_png(charts.ladder_chart(tmp_path))
    (axis,) = charts.ladder_figure(report).axes
    heights = [round(bar.get_height()) for bar in axis.patches]
    assert heights == [1000, 1100, 1300, 6475, 7166, 8624, 8950]  # measured (none for fp8_allgather), reference
    assert axis.get_ylabel() == "tokens/s per GPU" and len(axis.get_xticklabels()) == 4


def test_a_rung_short_of_its_steps_is_marked_unfinished_without_a_ratio(plain_line, tmp_path):
    def summary(tps: int, last: int):
        return torchtitan_metrics.summarize(rank_log(plain_line, {10: [(3.6, tps, 50.0)], last: [(3.5, tps, 50.0)]}))

    results = [
        ladder_report.RungResult("baseline", tmp_path / "b.log", summary(1000, 2000)),
        ladder_report.RungResult("compile", tmp_path / "c.log", summary(1500, 800)),  # stopped at step 800
    ]
    report = json.loads(ladder_report.write(results, 2000, tmp_path)[0].read_text())
    rows = {row["rung"]: row for row in report["rungs"]}
    assert (rows["baseline"]["finished"], rows["baseline"]["tps_vs_baseline"]) == (True, 1.0)
    assert (rows["compile"]["finished"], rows["compile"]["steps_reached"]) == (False, 800)
    assert rows["compile"]["tps_vs_baseline"] is None
    markdown = (tmp_path / "report.md").read_text()
    assert "| + torch.compile | 1,500 | unfinished (800 / 2000 steps) |" in markdown
    assert "Each rung ran" not in markdown
    # an unfinished baseline gives no ratio to anyone
    results[0] = ladder_report.RungResult("baseline", tmp_path / "b.log", summary(1000, 1999))
    report = json.loads(ladder_report.write(results, 2000, tmp_path)[0].read_text())
    assert [row["tps_vs_baseline"] for row in report["rungs"]] == [None, None]
