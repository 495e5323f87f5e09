"""Charts beside the reports: a run's result (its loss, base and tuned validation loss, learning rate),
loss curves compared, the scaling sweep, the ladder, the training benchmark, the benchmark step's scores.
matplotlib, headless:
figures are built on the Agg canvas (no pyplot, no display) and written as PNG atomically. Each
``*_figure`` function returns the Figure, so a caller (or a test) can read back exactly what was
drawn; ``save`` writes it.

    python -m llm_pipeline.charts scaling <sweep folder>     scaling.png from scaling.json
    python -m llm_pipeline.charts ladder <ladder folder>     report.png from report.json
    python -m llm_pipeline.charts benchmark <run>/benchmark  benchmark.png from benchmark.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110
LOG_SCALE_SPREAD = 30  # bars further apart than this share a log axis, so the small ones stay visible
WIDTH_INCHES, ROW_HEIGHT_INCHES = 8, 4.2  # one axis per row
SCALING_JSON, SCALING_PNG = "scaling.json", "scaling.png"
LADDER_JSON, LADDER_PNG = "report.json", "report.png"


def _figure(rows: int = 1) -> tuple[Figure, list]:
    figure = Figure(figsize=(WIDTH_INCHES, ROW_HEIGHT_INCHES * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = [figure.add_subplot(rows, 1, i + 1) for i in range(rows)]
    return figure, axes


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as PNG at ``path`` (complete or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    figure.savefig(partial, format="png")
    partial.replace(path)
    return path


def loss_figure(
    curves: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    *,
    x_label: str,
    title: str,
    differences: Sequence[tuple[str, Sequence[float], Sequence[float]]] = (),
    tolerance: float | None = None,
) -> Figure:
    """Loss of each (label, x, loss) curve on one axis; with ``differences`` (label, x, relative
    difference to the reference), a second axis shows them against the tolerance line."""
    figure, axes = _figure(2 if differences else 1)
    loss_axis = axes[0]
    colors = {label: f"C{index}" for index, (label, _, _) in enumerate(curves)}  # a run keeps its color below
    for label, xs, losses in curves:
        loss_axis.plot(list(xs), list(losses), marker="." if len(xs) < 60 else None, label=label, color=colors[label])
    loss_axis.set(xlabel=x_label, ylabel="training loss", title=title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    if differences:
        diff_axis = axes[1]
        for label, xs, values in differences:
            diff_axis.plot(list(xs), [v * 100 for v in values], label=label, color=colors.get(label))
        if tolerance is not None:
            diff_axis.axhline(tolerance * 100, color="red", linestyle="--", label=f"tolerance {tolerance:.1%}")
        diff_axis.set(xlabel=x_label, ylabel="|loss - reference| / reference (%)", title="relative difference")
        diff_axis.grid(alpha=0.3)
        diff_axis.legend()
    return figure


def result_figure(
    steps: Sequence[int],
    losses: Sequence[float],
    *,
    validation: Sequence[tuple[str, float]] = (),
    learning_rates: Sequence[tuple[int, float]] = (),
    title: str,
) -> Figure:
    """One run's result: its training loss by step, each (model, validation loss) of ``validation`` (base and
    tuned) as a level line on the same axis, and below, the learning rate by step where it was logged."""
    figure, axes = _figure(2 if learning_rates else 1)
    loss_axis = axes[0]
    loss_axis.plot(list(steps), list(losses), marker="." if len(steps) < 60 else None, label="training loss")
    for index, (model, value) in enumerate(validation, 1):
        loss_axis.axhline(value, color=f"C{index}", linestyle="--", label=f"{model} validation loss {value:.4f}")
    loss_axis.set(xlabel="optimizer step", ylabel="loss", title=title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    if learning_rates:
        rate_axis = axes[1]
        rate_axis.plot([s for s, _ in learning_rates], [r for _, r in learning_rates], color="gray", label="lr")
        rate_axis.set(xlabel="optimizer step", ylabel="learning rate", title="learning rate")
        rate_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        rate_axis.grid(alpha=0.3)
    return figure


def scaling_figure(
    nodes: Sequence[int], measured: Sequence[float], reference: Sequence[float | None], *, unit: str, title: str
) -> Figure:
    """Measured throughput against nodes, the linear-scaling line from the smallest run, and the
    published reference where there is one."""
    figure, (axis,) = _figure()
    axis.plot(list(nodes), list(measured), marker="o", label="measured")
    first_nodes, first = nodes[0], measured[0]
    axis.plot(
        list(nodes), [first * n / first_nodes for n in nodes], linestyle="--", color="gray", label="linear scaling"
    )
    known = [(n, r) for n, r in zip(nodes, reference, strict=True) if r is not None]
    if known:
        axis.plot(
            [n for n, _ in known], [r for _, r in known], marker="s", linestyle=":", label="reference (published)"
        )
    axis.set(xlabel="nodes", ylabel=unit, title=title, xticks=list(nodes))
    axis.grid(alpha=0.3)
    axis.legend()
    return figure


def bar_figure(
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    unit: str,
    title: str,
) -> Figure:
    """Grouped bars: one group per label, one bar per (name, values) series; a None value draws no bar."""
    figure, (axis,) = _figure()
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series):
        positions = [i + (index - (len(series) - 1) / 2) * width for i, v in enumerate(values) if v is not None]
        heights = [v for v in values if v is not None]
        axis.bar(positions, heights, width=width, label=name)
    axis.set_xticks(range(len(labels)), list(labels), rotation=15, ha="right")
    axis.set(ylabel=unit, title=title)
    axis.grid(alpha=0.3, axis="y")
    axis.legend()
    return figure


def benchmark_figure(
    variants: Sequence[tuple[str, float | None, Sequence[float]]], *, title: str, note: str = ""
) -> Figure:
    """The training benchmark: each (variant, median tokens/s or None, every timed step) as a bar at
    the median with the timed steps as dots over it (their spread is the host's noise); ``note`` under
    the axes says how to read it (a CPU run)."""
    names = [name for name, _, _ in variants]
    figure = bar_figure(names, [("median", [median for _, median, _ in variants])], unit="tokens/s", title=title)
    axis = figure.axes[0]
    for index, (_, _, samples) in enumerate(variants):
        if samples:
            axis.plot(
                [index] * len(samples), list(samples), "k.", alpha=0.5, label="timed steps" if index == 0 else None
            )
    axis.legend()
    if note:
        figure.text(0.5, 0.01, note, ha="center", va="bottom", fontsize="small", wrap=True)
    return figure


def sweep_figure(report: dict) -> Figure:
    """The scaling sweep's figure from its scaling.json (jobs/scaling_report.py writes it)."""
    rows = report["rows"]
    return scaling_figure(
        [row["nodes"] for row in rows],
        [row["sequences_per_second"] for row in rows],
        [row["reference_sequences_per_second"] for row in rows],
        unit="sequences/s",
        title=f"scaling sweep: {rows[0]['backend']}, method {report['plan']['base'].get('method')}",
    )


def ladder_figure(report: dict) -> Figure:
    """The ladder's figure from its report.json (training/torchtitan/report.py writes it): tokens/s
    per GPU of each rung, measured beside the reference figures."""
    rows = report["rungs"]
    series = [
        ("measured", [row["measured"]["tps"] if row["measured"] else None for row in rows]),
        ("reference (32 H100, reported)", [row["reference_tps"] for row in rows]),
    ]
    figure = bar_figure(
        [row["title"] for row in rows],
        series,
        unit="tokens/s per GPU",
        title=f"pretraining ladder, {report['steps_per_rung']} steps per rung",
    )
    heights = [value for _, values in series for value in values if value]
    if heights and max(heights) > LOG_SCALE_SPREAD * min(heights):  # e.g. a CPU rehearsal beside H100 figures
        axis = figure.axes[0]
        axis.set_yscale("log")
        axis.set_ylabel("tokens/s per GPU (log scale)")
    return figure


def tasks_figure(rows: Sequence[dict]) -> Figure:
    """The benchmark step's scores: base and tuned per task (benchmark.json's rows), each bar with its stderr."""
    figure = bar_figure(
        [f"{row['task']} ({row['shots']}-shot)" for row in rows],
        [(model, [row[model] for row in rows]) for model in ("base", "tuned")],
        unit="score (0 to 1)",
        title="Benchmark: base vs tuned per task",
    )
    axis = figure.axes[0]
    for bars, model in zip(list(axis.containers), ("base", "tuned"), strict=True):  # errorbar adds containers
        errors = [row[f"{model}_stderr"] or 0.0 for row in rows]
        middles = [bar.get_x() + bar.get_width() / 2 for bar in bars]
        axis.errorbar(middles, [row[model] for row in rows], errors, fmt="none", ecolor="k")
    axis.set_ylim(0, 1.05)
    return figure


def tasks_chart(folder: Path) -> Path:
    from llm_pipeline.benchmark import CHART
    from llm_pipeline.run_files import BENCHMARK_JSON

    return save(tasks_figure(json.loads((folder / BENCHMARK_JSON).read_text())["tasks"]), folder / CHART)


def scaling_chart(sweep_dir: Path) -> Path:
    return save(sweep_figure(json.loads((sweep_dir / SCALING_JSON).read_text())), sweep_dir / SCALING_PNG)


def ladder_chart(ladder_dir: Path) -> Path:
    return save(ladder_figure(json.loads((ladder_dir / LADDER_JSON).read_text())), ladder_dir / LADDER_PNG)


CHARTS = {"scaling": scaling_chart, "ladder": ladder_chart, "benchmark": tasks_chart}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_pipeline.charts", description="Draw a report's chart.")
    parser.add_argument("report", choices=tuple(CHARTS), help="which report")
    parser.add_argument(
        "folder",
        type=Path,
        help="the sweep folder (scaling.json), the ladder folder (report.json) or a run's benchmark folder "
        "(benchmark.json)",
    )
    args = parser.parse_args(argv)
    try:
        path = CHARTS[args.report](args.folder)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot chart the {args.report} report in {args.folder}: {exc!r}", file=sys.stderr)
        return 2
    print(f"chart written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
