"""The ladder report: each rung's measured figures, its ratio to the baseline, the reference beside.

Written to <run>/ladder/report.md and report.json. Figures come only from the rungs' own job logs
(torchtitan's metric lines); a rung without a log or without metric lines is listed as missing,
never filled in. A rung whose last logged step is short of the steps asked (stopped early, or the
report run by hand while it trains) is marked unfinished with the steps it reached, and no ratio
is computed from it or against it. The reference figures are what users reported on 32 H100; they are shown for
comparison and marked as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.training.torchtitan.ladder import REFERENCE, RUNG_TITLES
from llm_pipeline.training.torchtitan.metrics import RungSummary


@dataclass(frozen=True)
class RungResult:
    rung: str
    log: Path | None
    summary: RungSummary | None


def ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def finished(summary: RungSummary | None, steps: int) -> bool:
    return summary is not None and summary.last_step >= steps


def as_json(results: list[RungResult], steps: int) -> dict:
    baseline = next((r.summary for r in results if r.rung == "baseline" and finished(r.summary, steps)), None)
    ref_base = REFERENCE["tps"]["baseline"]
    rows = []
    for result in results:
        s = result.summary
        done = finished(s, steps)
        ref_tps = REFERENCE["tps"].get(result.rung)
        rows.append(
            {
                "rung": result.rung,
                "title": RUNG_TITLES[result.rung],
                "log": str(result.log) if result.log else None,
                "measured": s.to_dict() if s else None,
                "finished": done,
                "steps_reached": s.last_step if s else None,
                "tps_vs_baseline": ratio(s.tps, baseline.tps) if done and baseline else None,
                "reference_tps": ref_tps,
                "reference_tps_vs_baseline": ratio(ref_tps, ref_base),
                "reference_loss": REFERENCE["loss"].get(result.rung),
            }
        )
    return {"steps_per_rung": steps, "reference_setup": REFERENCE["setup"], "rungs": rows}


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct_change(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ({(value - 1) * 100:+.1f} %)"


def as_markdown(report: dict) -> str:
    lines = [
        "# torchtitan ladder report",
        "",
        f"Each rung was asked for {report['steps_per_rung']} steps; a rung that logged fewer is marked "
        "unfinished (steps reached / steps asked) and has no ratio. Measured figures come from torchtitan's own metric "
        "lines in each rung's job log: tokens/s per GPU, MFU and TFLOPS are medians over the logged "
        "steps past warm-up; memory is the peak reserved GPU memory; loss is at the last logged step.",
        "",
        "| rung | tokens/s/GPU | vs baseline | MFU % | TFLOPS | peak memory GiB (%) | loss (step) | device |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rungs"]:
        m = row["measured"]
        if m is None:
            lines.append(f"| {row['title']} | not measured: no metric lines in {row['log'] or 'no log'} | | | | | | |")
            continue
        ratio_cell = (
            _pct_change(row["tps_vs_baseline"])
            if row["finished"]
            else f"unfinished ({row['steps_reached']} / {report['steps_per_rung']} steps)"
        )
        lines.append(
            f"| {row['title']} | {m['tps']:,.0f} | {ratio_cell} | {m['mfu']:.2f} | "
            f"{m['tflops']:.2f} | {m['memory_gib']:.2f} ({m['memory_pct']:.2f} %) | "
            f"{m['final_loss']:.4f} ({m['last_step']}) | {m['device']} |"
        )
    lines += [
        "",
        "Chart: report.png (tokens/s per GPU of each rung, measured beside the reference).",
        "",
        f"Reference, for comparison only (reported by users, not measured here): {report['reference_setup']}.",
        "",
        "| rung | tokens/s/GPU | vs baseline | loss |",
        "|---|---|---|---|",
    ]
    for row in report["rungs"]:
        lines.append(
            f"| {row['title']} | {_num(row['reference_tps'], ',')} | "
            f"{_pct_change(row['reference_tps_vs_baseline'])} | {_num(row['reference_loss'], '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def write(results: list[RungResult], steps: int, folder: Path) -> tuple[Path, Path]:
    """Write report.json and report.md into `folder` (each atomically); return both paths."""
    report = as_json(results, steps)
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / "report.json", folder / "report.md")
    for path, text in zip(paths, (json.dumps(report, indent=2) + "\n", as_markdown(report)), strict=True):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return paths
