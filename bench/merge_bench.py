"""Merge benchmark: our streaming merge vs the reference approach vs a plain copy of the shards.

    .venv/bin/python bench/merge_bench.py [--shapes 1b,8b] [--workdir .bench] [--reference auto|always|never]
        [--repeats 5] [--cache cold|warm] [--quiet-disk-wait 30] [--report docs/merge-benchmark.md]

For each shape it writes a synthetic bf16 Llama checkpoint sharded like the Hub's and a LoRA
adapter (r=16 on q/v, the default), then runs, each in its own child process, measuring wall time
and peak RSS (os.wait4's ru_maxrss of that child):
  (a) ours:      python -m llm_pipeline.merge
  (b) reference: transformers from_pretrained + peft merge_and_unload + save_pretrained
  (c) copy:      copying the shard files (the disk floor: the merge must write as many bytes)
Results go to the console and docs/merge-benchmark.md. Generated files are removed afterwards. The
exit status is 1 when our output and the reference's disagree (a failed run stops with its log).
The test suite runs it once at the tiny shape (tests/bench/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "payloads")]

# This process stays small (no torch): a child's ru_maxrss counts the parent's pages it was forked with.
from bench import options  # noqa: E402
from bench.merge_report import previous_results, table, verdicts, write_report  # noqa: E402
from bench.options import GIB  # noqa: E402
from bench.synthetic_llama import SHAPES, tensor_shapes  # noqa: E402

REFERENCE = """
import sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
base, adapter, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, sys.argv[4]))
PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(out, safe_serialization=True)
"""
GENERATE = """
import sys
from pathlib import Path
from bench.synthetic_llama import SHAPES, write_adapter, write_model
folder, shape = Path(sys.argv[1]), SHAPES[sys.argv[2]]
write_model(folder / "base", shape)
write_adapter(folder / "adapter", shape)
"""
AGREE = """
import json, sys, torch
from pathlib import Path
from safetensors import safe_open
def tensor(folder, name):
    index = folder / "model.safetensors.index.json"
    file = json.loads(index.read_text())["weight_map"][name] if index.is_file() else "model.safetensors"
    with safe_open(str(folder / file), "pt") as handle:
        return handle.get_tensor(name).float()
ours, ref = Path(sys.argv[1]), Path(sys.argv[2])
# the reference rounds each delta to bf16 before adding it: agreement within bf16 rounding
names = ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj")
pairs = ((tensor(ours, f"model.layers.0.{n}.weight"), tensor(ref, f"model.layers.0.{n}.weight")) for n in names)
ok = all(torch.allclose(a, b, rtol=2**-7, atol=2**-7 * float(a.abs().max())) for a, b in pairs)
sys.exit(0 if ok else 1)
"""
COPY = """
import shutil, sys
for path in sys.argv[2:]:
    shutil.copyfile(path, sys.argv[1] + "/" + path.rsplit("/", 1)[-1])
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "payloads"), str(REPO)])}


def python(code: str, *args: object) -> list[str]:
    return [sys.executable, "-c", code, *map(str, args)]


def measure(label: str, command: list[str], log: Path, *, quiet: bool = False) -> dict:
    """Run one child; wall seconds and its peak resident set size."""
    with log.open("w") as out:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env())
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{label} failed (exit {child.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    result = {"wall_s": round(wall, 2), "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 3)}
    if not quiet:
        print(f"  {label:<10} {result['wall_s']:8.1f} s   peak RSS {result['peak_rss_gib']:6.2f} GiB", flush=True)
    return result


def settle(*folders: Path, drop: list[str] | tuple[str, ...] = (), quiet_wait_s: float = 30.0) -> None:
    """Remove outputs, flush dirty pages (so one run's writeback does not slow the next) and evict
    the input files from the page cache (only those files: nothing else on the machine is touched)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    wait_for_quiet_disk(Path(drop[0]) if drop else Path.cwd(), limit_s=quiet_wait_s)
    for path in drop:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def wait_for_quiet_disk(path: Path, quiet_s: float = 1.0, limit_s: float = 30.0) -> None:
    """Wait until the disk holding ``path`` has done no I/O for ``quiet_s`` (at most ``limit_s``).

    Deleting a large output makes file systems mounted with ``discard`` trim it in the background,
    which slows whatever runs next; waiting keeps that cost out of every measurement alike."""
    device = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
    if not stat.is_file():
        return
    deadline, last, quiet_since = time.monotonic() + limit_s, None, time.monotonic()
    while time.monotonic() < deadline:
        busy_ms = int(stat.read_text().split()[9])  # io_ticks: milliseconds spent doing I/O
        now = time.monotonic()
        if busy_ms != last:
            last, quiet_since = busy_ms, now
        elif now - quiet_since >= quiet_s:
            return
        time.sleep(0.1)


def warm(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as handle:
            while handle.read(64 * 1024 * 1024):
                pass


def reference_fits(model_bytes: int) -> tuple[bool, str]:
    """The reference holds the whole model plus a save buffer of one shard; skip it when that cannot fit."""
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable"))
    needed = int(model_bytes * 1.35) + 2 * GIB
    reason = (
        f"it would hold about {needed / GIB:.0f} GiB in RAM; "
        f"{available / GIB:.0f} GiB are available and other work shares them"
    )
    return needed < 0.85 * available, reason


def summarize(samples: list[dict]) -> dict:
    """Median wall time of the repeats (robust to a neighbour's burst of I/O), all samples kept."""
    walls = sorted(sample["wall_s"] for sample in samples)
    return {
        "wall_s": round(statistics.median(walls), 2),
        "wall_s_min": walls[0],
        "walls_s": walls,
        "peak_rss_gib": max(sample["peak_rss_gib"] for sample in samples),
    }


def bench_shape(
    name: str, work: Path, reference: str, ref_dtype: str, repeats: int, cache: str, quiet_wait_s: float
) -> dict:
    shape = SHAPES[name]
    folder = work / name
    settle(folder, quiet_wait_s=quiet_wait_s)
    folder.mkdir(parents=True)
    generated = measure("generate", python(GENERATE, folder, name), folder / "generate.log", quiet=True)
    base, adapter = folder / "base", folder / "adapter"
    model_bytes = sum(p.stat().st_size for p in base.glob("*.safetensors"))
    shards = sorted(str(p) for p in base.glob("*.safetensors"))
    params = sum(math.prod(d) for d in tensor_shapes(shape).values())
    print(
        f"{name}: {options.sizes(params, model_bytes)} in {len(shards)} shard(s), "
        f"written in {generated['wall_s']:.0f} s",
        flush=True,
    )
    config = folder / "run.toml"
    config.write_text(f'[paths]\noutput_dir = "{folder / "run"}"\n')
    runs: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "shape": shape.__dict__,
        "parameters": params,
        "model_bytes": model_bytes,
        "shards": len(shards),
        "repeats": repeats,
        "cache": cache,
    }
    inputs = [*shards, *(str(p) for p in adapter.iterdir())] if cache == "cold" else []

    def prepare(*outputs: Path) -> None:
        settle(*outputs, drop=inputs, quiet_wait_s=quiet_wait_s)
        if cache == "warm":
            warm(shards)

    copy_out, ours_out = folder / "copy", folder / "ours"
    merge_command = [
        sys.executable,
        "-m",
        "llm_pipeline.merge",
        "--config",
        str(config),
        "--base",
        str(base),
        "--adapter",
        str(adapter),
        "--output",
        str(ours_out),
    ]
    samples: dict[str, list[dict]] = {"copy": [], "ours": []}
    for attempt in range(repeats):  # alternate the order so neither always follows the other
        for method in ("copy", "ours") if attempt % 2 == 0 else ("ours", "copy"):
            prepare(copy_out, ours_out)  # every run starts from the same state: no earlier output on disk
            if method == "copy":
                copy_out.mkdir()
                samples["copy"].append(measure("copy", python(COPY, copy_out, *shards), folder / "copy.log"))
            else:
                samples["ours"].append(measure("ours", merge_command, folder / "ours.log"))
    settle(copy_out, quiet_wait_s=quiet_wait_s)
    runs["copy"], runs["ours"] = summarize(samples["copy"]), summarize(samples["ours"])
    if not ours_out.exists():  # the reference check below compares against our output
        subprocess.run(merge_command, env=child_env(), stdout=subprocess.DEVNULL, check=True)
    fits, reason = reference_fits(model_bytes)
    if reference == "always" or (reference == "auto" and fits):
        prepare()
        ref_out = folder / "reference"
        runs["reference"] = measure(
            "reference", python(REFERENCE, base, adapter, ref_out, ref_dtype), folder / "reference.log"
        )
        runs["outputs_agree"] = subprocess.run(python(AGREE, ours_out, ref_out), env=child_env()).returncode == 0
        print(f"  outputs agree (bf16 rounding): {runs['outputs_agree']}", flush=True)
        settle(ref_out, quiet_wait_s=quiet_wait_s)
    else:
        runs["reference"] = None
        runs["reference_skipped"] = f"skipped: {reason}" if reference == "auto" else "skipped: --reference never"
        print(f"  reference  {runs['reference_skipped']}", flush=True)
    settle(ours_out, quiet_wait_s=quiet_wait_s)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_shapes(parser, "1b,8b")
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench")
    parser.add_argument(
        "--reference",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: skip it when it cannot fit in RAM",
    )
    parser.add_argument("--reference-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "merge-benchmark.md")
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of copy and ours per shape (the median is reported)"
    )
    parser.add_argument(
        "--cache",
        choices=("cold", "warm"),
        default="cold",
        help="evict the inputs from the page cache before each run (cold: the disk floor) or read them first (warm)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    options.add_quiet_disk_wait(parser)
    args = parser.parse_args(argv)
    results = {}
    try:
        for name in options.chosen_shapes(parser, args.shapes):
            results[name] = bench_shape(
                name, args.workdir, args.reference, args.reference_dtype, args.repeats, args.cache, args.quiet_disk_wait
            )
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print("\n".join(["", *table(results), "", *verdicts(results)]))
    write_report(args.report, {**previous_results(args.report), **results}, args.reference_dtype)
    print(f"\nreport written to {options.shown(args.report)}")
    disagree = [name for name, runs in results.items() if runs.get("outputs_agree") is False]
    if disagree:
        print(f"our merge and the reference disagree at shape(s) {', '.join(disagree)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
