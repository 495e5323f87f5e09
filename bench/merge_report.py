"""The merge benchmark's report: a table, the verdicts against the targets, docs/merge-benchmark.md."""

from __future__ import annotations

import json
from pathlib import Path

from bench import options
from bench.synthetic_llama import SMOKE_SHAPE

TARGETS = {"peak_rss_gib_8b": 2.0, "wall_vs_copy": 1.5, "speedup_vs_reference_1b": 3.0}


def verdicts(results: dict) -> list[str]:
    lines = []
    for name, runs in results.items():
        if name == SMOKE_SHAPE:
            lines.append(f"{name}: a smoke run (process start-up outweighs the work): no target applies")
            continue
        ours, copy, ref = runs["ours"], runs["copy"], runs["reference"]
        ratio = ours["wall_s"] / copy["wall_s"]
        target = TARGETS["wall_vs_copy"]
        lines.append(f"{name}: wall {ratio:.2f}x the copy floor (target <= {target}): {_verdict(ratio <= target)}")
        if name == "8b":
            peak, target = ours["peak_rss_gib"], TARGETS["peak_rss_gib_8b"]
            lines.append(f"8b: peak RSS {peak:.2f} GiB (target < {target} GiB): {_verdict(peak < target)}")
        if name == "1b" and ref:
            speedup, target = ref["wall_s"] / ours["wall_s"], TARGETS["speedup_vs_reference_1b"]
            lines.append(
                f"1b: {speedup:.1f}x faster than the reference (target >= {target}): {_verdict(speedup >= target)}"
            )
    return lines


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def table(results: dict) -> list[str]:
    rows = ["| shape | method | wall (s) | vs copy | peak RSS (GiB) | GB/s written |", "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        for method in ("ours", "reference", "copy"):
            run = runs[method]
            if run is None:
                rows.append(f"| {name} | {method} | {runs['reference_skipped']} | | | |")
                continue
            rate = runs["model_bytes"] / 1e9 / run["wall_s"]
            vs_copy = run["wall_s"] / runs["copy"]["wall_s"]
            rows.append(
                f"| {name} | {method} | {run['wall_s']:.3g} | {vs_copy:.2f}x | {run['peak_rss_gib']:.2f} | {rate:.2f} |"
            )
    return rows


def previous_results(path: Path) -> dict:
    """Results of an earlier run kept in the report (shapes not measured this time stay listed)."""
    try:
        return json.loads(path.read_text().split("```json", 1)[1].split("```", 1)[0])
    except (OSError, IndexError, ValueError):
        return {}


def write_report(path: Path, results: dict, ref_dtype: str) -> None:
    machine = options.machine()
    cache = "evicted from" if next(iter(results.values()))["cache"] == "cold" else "read into"
    text = [
        "# Merge benchmark",
        "",
        "Produced by `make bench` (`bench/merge_bench.py`); do not edit by hand.",
        "",
        f"Machine: {machine}. Synthetic bf16 Llama checkpoints sharded like the Hub's; adapter r=16 on q_proj/v_proj.",
        f"Reference: `AutoModelForCausalLM.from_pretrained(dtype={ref_dtype})` + `PeftModel.merge_and_unload()` "
        "+ `save_pretrained`.",
        "Each method runs in its own process. Before each run the earlier outputs are deleted, dirty pages flushed, "
        "the disk left to go quiet (a `discard` mount trims deleted files in the background) "
        f"and the inputs {cache} the page cache; "
        "copy and ours alternate, repeated; the table gives the median wall time (every sample is in the JSON below) "
        "and the highest `ru_maxrss` of the process. The disk is shared with other work, so single samples vary a lot.",
        "",
        *table(results),
        "",
        *[f"- {line}" for line in verdicts(results)],
        "",
        "```json",
        json.dumps(results, indent=2),
        "```",
        "",
    ]
    path.write_text("\n".join(text))
