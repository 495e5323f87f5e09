"""The scaling sweep's report: throughput per node count from the training logs, as a table.

    python3 -m llm_pipeline.jobs.scaling_report --sweep-dir <run folder>/sweep

Reads ``sweep.json`` (written at submission) and each point's newest ``logs/train-<job>.log`` (in the
smoke sweep, ``<sweep>/smoke``, its ``logs/smoke-train-<job>.log``). The
trainers print one line per log event (training/callbacks.py, run_files.ProgressLine):
``step 20/40 | loss 1.2 | lr 2.0e-05 | 3.70 samples/s | 15155 tokens/s | eta 0:01:00``. The first
event is left out when there are more (it carries start-up and graph compilation), the median of
the rest is the point's throughput. Time per step is global batch / sequences per second; scaling
efficiency is (throughput / smallest run's throughput) / (nodes / smallest run's nodes). The
reference column is the published Trainium Llama 2 7B full fine-tuning result (trn1.32xlarge,
TP 8, seq 4096, global batch 256), shown only for a run of that shape (the neuron engine, full
fine-tuning of Llama 2 7B, max_length 4096, TP 8, global batch 256); any other run is compared with
its own smallest run.
Writes ``scaling.md`` and ``scaling.json`` next to ``sweep.json``. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import smoke
from llm_pipeline.jobs.sweep_plan import PLAN_NAME
from llm_pipeline.run_files import BackendLine, ProgressLine, StepLog

# sequences/s on 1, 2 and 4 trn1.32xlarge nodes, Llama 2 7B full fine-tuning, seq 4096, GBS 256
NEURON_FULL_REFERENCE = {1: 3.7, 2: 7.4, 4: 14.6}
REFERENCE_NOTE = "published Trainium result: Llama 2 7B full fine-tuning, trn1.32xlarge, TP 8, seq 4096, GBS 256"
# The run shape the published numbers belong to (sweep.json's base facts; the engine comes from the log).
REFERENCE_SHAPE = {"model_id": "meta-llama/Llama-2-7b-hf", "method": "full", "max_length": 4096, "model_parallel": 8}
REFERENCE_GLOBAL_BATCH = 256


class ReportError(PipelineError, RuntimeError):
    """The sweep cannot be reported yet; the message names the file."""


def newest_train_log(point_dir: Path) -> Path:
    """The point's newest training log: train-<job>.log, or smoke-train-<job>.log in a smoke sweep's point."""
    logs = [path for _, path in StepLog.of(point_dir / "logs", lambda step: step in ("train", f"{smoke.PREFIX}train"))]
    if not logs:
        raise ReportError(f"{point_dir / 'logs'} has no train-<job>.log: the point's training did not run")
    return logs[-1]


def read_log(path: Path) -> dict:
    """Throughput events and the backend named in one training log."""
    events, backend = [], None
    for line in path.read_text(errors="replace").splitlines():
        if progress := ProgressLine.parse(line):
            events.append((progress.step, progress.samples_per_second, progress.tokens_per_second))
        elif backend is None and (found := BackendLine.parse(line)):
            backend = found.backend
    if not events:
        raise ReportError(f"{path} has no throughput lines (step N/M | loss | ... samples/s): did training log?")
    measured = events[1:] if len(events) > 1 else events
    return {
        "log": str(path),
        "backend": backend or "unknown",
        "events": len(events),
        "sequences_per_second": statistics.median(e[1] for e in measured),
        "tokens_per_second": statistics.median(e[2] for e in measured),
    }


def build_rows(plan: dict) -> list[dict]:
    rows = []
    for point in plan["points"]:
        row = {key: point[key] for key in ("nodes", "gradient_accumulation_steps", "global_batch")}
        row |= read_log(newest_train_log(Path(point["output_dir"])))
        row["seconds_per_step"] = row["global_batch"] / row["sequences_per_second"]
        rows.append(row)
    first = rows[0]
    base = plan["base"]
    use_reference = (
        first["backend"] == "neuron"
        and all(base.get(key) == value for key, value in REFERENCE_SHAPE.items())
        and all(row["global_batch"] == REFERENCE_GLOBAL_BATCH for row in rows)
    )
    for row in rows:
        speedup = row["sequences_per_second"] / first["sequences_per_second"]
        row["speedup"] = speedup
        row["scaling_efficiency"] = speedup / (row["nodes"] / first["nodes"])
        row["step_time_vs_first"] = row["seconds_per_step"] / first["seconds_per_step"]
        row["reference_sequences_per_second"] = NEURON_FULL_REFERENCE.get(row["nodes"]) if use_reference else None
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| nodes | grad. accum. | global batch | sequences/s | tokens/s | s/step | step time vs first "
        "| speedup | scaling efficiency | reference seq/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        reference = row["reference_sequences_per_second"]
        lines.append(
            f"| {row['nodes']} | {row['gradient_accumulation_steps']} | {row['global_batch']} "
            f"| {row['sequences_per_second']:.2f} | {row['tokens_per_second']:.0f} | {row['seconds_per_step']:.2f} "
            f"| {row['step_time_vs_first']:.2f}x | {row['speedup']:.2f}x | {row['scaling_efficiency'] * 100:.1f} % "
            f"| {reference if reference is not None else '-'} |"
        )
    return lines


def write_report(sweep_dir: Path) -> Path:
    plan_file = sweep_dir / PLAN_NAME
    try:
        plan = json.loads(plan_file.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{plan_file} cannot be read ({exc}); submit the sweep first") from None
    rows = build_rows(plan)
    backend = rows[0]["backend"]
    reference = (
        f"Reference column: {REFERENCE_NOTE}."
        if rows[0]["reference_sequences_per_second"] is not None
        else f"No published reference for this run ({backend} engine, {plan['base'].get('model_id', '?')}, "
        f"{plan['base'].get('method')}): the smallest run is the baseline."
    )
    text = [
        "# Scaling sweep",
        "",
        f"Run config: `{plan['config']}`; backend {backend}; method {plan['base'].get('method')}; "
        f"sequence length {plan['base'].get('max_length')}. Each node count trains the same config with "
        "gradient accumulation adjusted to keep the global batch. Throughput is the median of the logged "
        "events after the first; efficiency and step time are against the smallest node count.",
        "",
        *table(rows),
        "",
        reference,
        "",
        "Chart: scaling.png (throughput vs nodes, the linear-scaling line from the smallest run, the reference), "
        "drawn by `python -m llm_pipeline.charts scaling <sweep folder>` after this table.",
        "",
    ]
    (sweep_dir / "scaling.md").write_text("\n".join(text))
    (sweep_dir / "scaling.json").write_text(json.dumps({"plan": plan, "rows": rows}, indent=2) + "\n")
    print("\n".join(table(rows)))
    return sweep_dir / "scaling.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m llm_pipeline.jobs.scaling_report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sweep-dir", type=Path, required=True, help="the sweep folder (holds sweep.json)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.sweep_dir)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"scaling report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
