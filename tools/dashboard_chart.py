"""Draw the dashboard's main panels from a Prometheus, without Grafana (no Grafana installs from Debian or PyPI).

    python tools/dashboard_chart.py --prometheus http://127.0.0.1:9090 --start 1700000000 --end 1700000060 \\
        --out docs/observability.png

Each drawn panel's query comes from observability/dashboards/cluster-and-run.json (evaluated with
query_range, `$run` and `$job` as given or Grafana's "All"), so the picture shows exactly what the
dashboard asks for; the x axis is seconds since --start. The figure says it is not a Grafana screenshot.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DASHBOARD = Path(__file__).resolve().parents[1] / "observability" / "dashboards" / "cluster-and-run.json"
PANELS = (  # dashboard titles, in reading order: the run, then the node, then Slurm
    "Loss", "Tokens per second", "Step and steps to go", "Learning rate",
    "CPU busy", "Memory available", "Slurm nodes by state", "Slurm jobs by state",
)  # fmt: skip
UNITS = {"percentunit": (100, "%", (0, 105)), "bytes": (2**-30, "GiB", None)}  # Grafana unit -> scale, label, y range
UNLABELLED = {"__name__", "job", "cluster"}  # the same on every local series: no help in a legend
MAX_POINTS = 300
TITLE = "drawn from the local rehearsal's Prometheus data with matplotlib, not a Grafana screenshot"


def range_step(start: float, end: float) -> float:
    return max(1.0, (end - start) / MAX_POINTS)


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict]:
    step = range_step(start, end)
    first = end - math.ceil((end - start) / step) * step  # counted back from end, so the newest sample is drawn
    params = urllib.parse.urlencode({"query": expr, "start": first, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus.rstrip('/')}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('error', body)}")
    return body["data"]["result"]


def panel_queries(run: str, job: str) -> dict[str, tuple[list[str], str]]:
    """The drawn panels' title -> (their PromQL with the variables filled in, Grafana unit)."""
    panels = {panel["title"]: panel for panel in json.loads(DASHBOARD.read_text())["panels"]}
    missing = [title for title in PANELS if title not in panels]
    if missing:
        raise ValueError(f"{DASHBOARD.name} has no panel {', '.join(missing)}")
    return {
        title: (
            [target["expr"].replace("$run", run).replace("$job", job) for target in panels[title]["targets"]],
            panels[title].get("fieldConfig", {}).get("defaults", {}).get("unit", "none"),
        )
        for title in PANELS
    }


def with_gaps(values: list[list], step: float) -> tuple[list[float], list[float]]:
    """Timestamps and values with NaN where samples are missing, so a series that ended (or paused) is drawn as
    ending there rather than joined to its next sample."""
    times, numbers = [], []
    for index, (timestamp, value) in enumerate(values):
        if index and float(timestamp) - float(values[index - 1][0]) > 1.5 * step:
            times.append(float(values[index - 1][0]) + step)
            numbers.append(math.nan)
        times.append(float(timestamp))
        numbers.append(float(value))
    return times, numbers


def legend(metric: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(metric.items()) if key not in UNLABELLED)


def draw(prometheus: str, start: float, end: float, out: Path, *, run: str = ".*", job: str = ".*") -> dict[str, int]:
    """Write the panels to ``out`` (PNG); returns each panel's title -> points drawn."""
    figure = Figure(figsize=(13, 3.2 * ((len(PANELS) + 1) // 2)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(f"Dashboard cluster-and-run: {TITLE}", fontsize=11)
    drawn = {}
    for index, (title, (exprs, unit)) in enumerate(panel_queries(run, job).items()):
        axis = figure.add_subplot((len(PANELS) + 1) // 2, 2, index + 1)
        scale, label, y_range = UNITS.get(unit, (1, "", None))
        drawn[title] = 0
        for expr in exprs:
            for series in query_range(prometheus, expr, start, end):
                times, values = with_gaps(series["values"], range_step(start, end))
                seconds = [timestamp - start for timestamp in times]
                axis.plot(seconds, [value * scale for value in values], label=legend(series["metric"]) or expr)
                drawn[title] += len(series["values"])
        axis.set(title=title, xlabel="seconds since the run started", ylabel=label, xlim=(0, end - start), ylim=y_range)
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=7, loc="best")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL of the Prometheus HTTP API")
    parser.add_argument("--start", type=float, required=True, help="run start, Unix seconds (x = 0)")
    parser.add_argument("--end", type=float, default=None, help="Unix seconds (default: now)")
    parser.add_argument("--run", default=".*", help="the dashboard's $run (regex; default all)")
    parser.add_argument("--job", default=".*", help="the dashboard's $job (regex; default all)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    end = time.time() if args.end is None else args.end
    if end <= args.start:
        print(f"error: --end ({end:.0f}) must be after --start ({args.start:.0f})", file=sys.stderr)
        return 2
    try:
        drawn = draw(args.prometheus, args.start, end, args.out, run=args.run, job=args.job)
    except (OSError, ValueError) as exc:
        print(f"error: {args.prometheus}: {exc}", file=sys.stderr)
        return 2
    empty = [title for title, points in drawn.items() if not points]
    print(f"wrote {args.out}" + (f"; no data for {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
