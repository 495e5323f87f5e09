"""Full-weight consolidation benchmark: our streaming consolidation vs a plain copy of the rank files.

    .venv/bin/python bench/consolidate_bench.py [--shapes 1b,8b] [--tp 8] [--form xser|plain] [--repeats 3]
        [--workdir .bench] [--quiet-disk-wait 30] [--report docs/consolidate-benchmark.md]

For each shape it writes a synthetic bf16 Llama full-model checkpoint laid out as optimum-neuron
0.4.5 saves it at TP ``--tp`` (bench/synthetic_neuron.py), then runs, each in its own child process
and alternating, with the inputs evicted from the page cache before each run (same protocol as the
merge benchmark):
  (a) ours: python -m llm_pipeline.consolidate (TP rank files -> HF model folder)
  (b) copy: copying the rank files (the disk floor: consolidation reads and writes as many bytes)
measuring wall time and peak RSS (os.wait4's ru_maxrss). The output of (a) is checked against the
shape's HF tensor names and shapes (a mismatch or a failed run stops it with exit status 1). Results:
console and docs/consolidate-benchmark.md. The test suite runs it once at the tiny shape
(tests/bench/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "payloads")]

# This process stays small (no torch): a child's ru_maxrss counts the parent's pages it was forked with.
from bench import options  # noqa: E402
from bench.merge_bench import measure, python, settle, summarize  # noqa: E402
from bench.synthetic_llama import SHAPES, SMOKE_SHAPE, tensor_shapes  # noqa: E402

TARGET_VS_COPY = 1.5
GENERATE = """
import sys
from pathlib import Path
from bench.synthetic_llama import SHAPES
from bench.synthetic_neuron import write_checkpoint
print(write_checkpoint(Path(sys.argv[1]), SHAPES[sys.argv[2]], int(sys.argv[3]), xser=sys.argv[4] == "xser"))
"""
COPY = """
import shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
"""


def check_output(folder: Path, shape_name: str) -> int:
    """Names and shapes of the written model against the shape's HF layout; returns the tensor count."""
    from llm_pipeline.weights.model_files import open_model_folder

    expected = tensor_shapes(SHAPES[shape_name])
    written = {name: slot.shape for name, slot in open_model_folder(folder).tensors.items()}
    if written != {name: tuple(dims) for name, dims in expected.items()}:
        missing = sorted(set(expected) ^ set(written))
        raise SystemExit(f"consolidated {shape_name} model does not match the HF layout (e.g. {missing[:1]})")
    return len(written)


def bench_shape(name: str, work: Path, tp: int, form: str, repeats: int, quiet_wait_s: float) -> dict:
    folder = work / f"{name}-tp{tp}-{form}"
    settle(folder, quiet_wait_s=quiet_wait_s)
    folder.mkdir(parents=True)
    checkpoint = folder / "checkpoints" / "checkpoint-1"
    generated = measure("generate", python(GENERATE, checkpoint, name, tp, form), folder / "generate.log", quiet=True)
    model = checkpoint / "shards" / "model"
    inputs = sorted(str(p) for p in model.rglob("*") if p.is_file())
    model_bytes = sum(os.path.getsize(p) for p in inputs)
    params = sum(math.prod(d) for d in tensor_shapes(SHAPES[name]).values())
    print(
        f"{name} TP={tp} ({form}): {options.sizes(params, model_bytes)} in {len(inputs)} "
        f"file(s), written in {generated['wall_s']:.0f} s",
        flush=True,
    )
    config = folder / "run.toml"
    config.write_text(f'[paths]\noutput_dir = "{folder / "run"}"\nmodel_dir = "{folder / "no-base-model"}"\n')
    copy_out, ours_out = folder / "copy", folder / "merged"
    command = [sys.executable, "-m", "llm_pipeline.consolidate", "--config", str(config)]
    command += ["--checkpoint", str(checkpoint), "--output", str(ours_out)]
    samples: dict[str, list[dict]] = {"copy": [], "ours": []}
    load: list[float] = []  # the machine is shared: the 1-minute load average before each run, reported
    for attempt in range(repeats):  # alternate the order so neither always follows the other
        for method in ("copy", "ours") if attempt % 2 == 0 else ("ours", "copy"):
            settle(copy_out, ours_out, drop=inputs, quiet_wait_s=quiet_wait_s)
            load.append(round(os.getloadavg()[0], 2))
            if method == "copy":
                samples["copy"].append(measure("copy", python(COPY, model, copy_out), folder / "copy.log"))
            else:
                samples["ours"].append(measure("ours", command, folder / "ours.log"))
                tensors = check_output(ours_out, name)  # headers only: a few kilobytes, after the clock stops
    settle(copy_out, ours_out, quiet_wait_s=quiet_wait_s)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"), "shape": SHAPES[name].__dict__, "tp": tp, "form": form,
        "parameters": params, "model_bytes": model_bytes, "rank_files": len(inputs), "tensors_written": tensors,
        "repeats": repeats, "copy": summarize(samples["copy"]), "ours": summarize(samples["ours"]),
        "load_average_1min": load,
    }  # fmt: skip


def verdicts(results: dict) -> list[str]:
    lines, measured = [], []
    for key, runs in results.items():
        if runs["shape"] == SHAPES[SMOKE_SHAPE].__dict__:
            lines.append(f"{key}: a smoke run (process start-up outweighs the work): no target applies")
            continue
        measured.append(runs)
        ratio = runs["ours"]["wall_s"] / runs["copy"]["wall_s"]
        ok = "PASS" if ratio <= TARGET_VS_COPY else "FAIL"
        lines.append(f"{key}: wall {ratio:.2f}x the copy floor (target <= {TARGET_VS_COPY}): {ok}")
    by_size = sorted(measured, key=lambda runs: runs["model_bytes"])
    if len(by_size) > 1:
        small, large = by_size[0], by_size[-1]
        grow_model = large["model_bytes"] / small["model_bytes"]
        grow_rss = large["ours"]["peak_rss_gib"] / small["ours"]["peak_rss_gib"]
        lines.append(
            f"peak RSS {small['ours']['peak_rss_gib']:.2f} -> {large['ours']['peak_rss_gib']:.2f} GiB while the model "
            f"grows {grow_model:.1f}x ({small['model_bytes'] / 1e9:.1f} -> {large['model_bytes'] / 1e9:.1f} GB): "
            f"RSS grows {grow_rss:.2f}x; it is bounded by one decoder layer or the largest tensor, not the model"
        )
    return lines


def load_line(results: dict) -> str:
    values = [value for runs in results.values() for value in runs.get("load_average_1min", [])]
    if not values:
        return ""
    return (
        f"1-minute load average before the runs: {min(values):.1f} to {max(values):.1f} on {os.cpu_count()} CPUs "
        "(other work shares the machine; ours needs CPU for Python and torch, the copy hardly any)."
    )


def table(results: dict) -> list[str]:
    rows = [
        "| checkpoint | method | wall (s) | vs copy | peak RSS (GiB) | GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for key, runs in results.items():
        for method in ("ours", "copy"):
            run = runs[method]
            rate = runs["model_bytes"] / 1e9 / run["wall_s"]
            rows.append(
                f"| {key} | {method} | {run['wall_s']:.3g} | {run['wall_s'] / runs['copy']['wall_s']:.2f}x "
                f"| {run['peak_rss_gib']:.2f} | {rate:.2f} |"
            )
    return rows


def write_report(path: Path, results: dict, note: str) -> None:
    machine = options.machine()
    text = [
        "# Full-weight consolidation benchmark", "",
        "Produced by `bench/consolidate_bench.py`; do not edit by hand.", "",
        f"Machine: {machine}. Synthetic bf16 Llama full-model checkpoints laid out as optimum-neuron 0.4.5 saves "
        "them under tensor parallelism (`checkpoint-N/shards/model/dp_rank_00_tp_rank_TT_pp_rank_00.pt`, "
        "metadata, fused gate_up); `ours` is `.venv/bin/python -m llm_pipeline.consolidate` writing the Hugging Face "
        "model folder (checked against the HF names and shapes), `copy` copies the rank files (the disk floor). "
        "Each run is its own process; before each, earlier outputs are deleted, dirty pages flushed, the disk "
        "left to go quiet and the inputs evicted from the page cache; copy and ours alternate; the table gives "
        "the median wall time (all samples in the JSON) and the highest `ru_maxrss`. The disk is shared with "
        "other work, so single samples vary.", "",
        *([note, ""] if note else []),
        *([load_line(results), ""] if load_line(results) else []),
        *table(results), "", *[f"- {line}" for line in verdicts(results)], "",
        "```json", json.dumps(results, indent=2), "```", "",
    ]  # fmt: skip
    path.write_text("\n".join(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_shapes(parser, "1b,8b")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel size of the synthetic checkpoint")
    parser.add_argument(
        "--form", choices=("xser", "plain"), default="xser", help="rank file form (0.4.5 default: xser)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of copy and ours per shape (median reported)")
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "consolidate-benchmark.md")
    parser.add_argument("--note", default="", help="a line for the report (e.g. why a smaller shape was used)")
    options.add_quiet_disk_wait(parser)
    args = parser.parse_args(argv)
    shapes = options.chosen_shapes(parser, args.shapes)
    results = {}
    try:
        for name in shapes:
            results[f"{name} TP{args.tp} {args.form}"] = bench_shape(
                name, args.workdir, args.tp, args.form, args.repeats, args.quiet_disk_wait
            )
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print("\n".join(["", *table(results), "", *verdicts(results)]))
    write_report(args.report, results, args.note)
    print(f"\nreport written to {options.shown(args.report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
