"""CUDA-only checks of the torch engine: what the CPU suite cannot run, on one GPU, with the defaults users run.

    python bench/cuda_checks.py [--workdir .cuda-checks] [--report docs/cuda-checks.md] [--steps 6]

For every method (lora, dora, qlora, full) it trains the tiny random Llama with the run config a GPU user
gets: bf16, train.attention auto, train.liger_kernel auto (on where CUDA and liger-kernel are), the
engine's precision policy, a checkpoint half way; then resumes the LoRA run from that checkpoint to
twice the steps (the resume path under liger and bf16). Each run is the real train step
(`python -m llm_pipeline.train`) in its own process. It writes a report (device, versions, each run's
exit, seconds, the engine's own summary lines and its losses) and exits 1 when a run failed, 2 when
there is no CUDA device. Nothing here runs in CI: the device has to be lent.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "payloads")]

METHODS = ("lora", "dora", "qlora", "full")
VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "liger_kernel")
SUMMARY_MARKS = ("method ", "precision:", "step ", "error")


def run_config(folder: Path, *, method: str, steps: int) -> str:
    """A GPU user's run config for the tiny model: every lever at its default, bf16 on."""
    return f"""[model]
id = "tiny-random-llama"
dtype = "bfloat16"

[data]
dataset = "{folder.parent / "tiny-dolly.jsonl"}"
validation_fraction = 0.0
max_length = 128
packing = true

[paths]
model_dir = "{folder.parent / "tiny-llama"}"
output_dir = "{folder}"
compile_cache_dir = "{folder / "cache"}"

[lora]
r = 8
alpha = 16
dropout = 0.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

[parallel]
tensor_parallel_size = 1
devices_per_node = 1
nodes = 1

[train]
backend = "torch"
method = "{method}"
per_device_batch_size = 4
gradient_accumulation_steps = 1
max_steps = {steps}
learning_rate = 1e-3
bf16 = true
logging_steps = 1
save_steps = {max(1, steps // 2)}
save_total_limit = 2
"""


def train(config: Path, log: Path) -> dict:
    started = time.monotonic()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "payloads"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "llm_pipeline.train", "--prepare-data", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(SUMMARY_MARKS)]
    return {
        "exit": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "summary": lines[-14:],
        "stderr_tail": done.stderr.splitlines()[-6:] if done.returncode else [],
    }


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def report_text(device: str, found: dict, runs: dict) -> str:
    lines = [
        "# CUDA checks of the torch engine",
        "",
        f"Written by `bench/cuda_checks.py` on **{device}**; "
        + ", ".join(f"{name} {version}" for name, version in found.items())
        + ".",
        "",
        "| run | exit | seconds |",
        "|---|---|---|",
        *(f"| {name} | {run['exit']} | {run['seconds']} |" for name, run in runs.items()),
        "",
    ]
    for name, run in runs.items():
        lines += [f"## {name}", "", "```text", *run["summary"], *run["stderr_tail"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=REPO / ".cuda-checks")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "cuda-checks.md")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device: these checks run only on a GPU", file=sys.stderr)
        return 2
    from tools import tiny_model as tiny

    args.workdir.mkdir(parents=True, exist_ok=True)
    tiny.write_tiny_model(args.workdir / "tiny-llama")
    tiny.write_dolly_jsonl(args.workdir / "tiny-dolly.jsonl", 240)
    runs = {}
    for method in METHODS:
        folder = args.workdir / method
        folder.mkdir(exist_ok=True)
        config = folder / "run.toml"
        config.write_text(run_config(folder, method=method, steps=args.steps))
        runs[method] = train(config, folder / "train.log")
        print(f"{method}: exit {runs[method]['exit']} in {runs[method]['seconds']} s", flush=True)
    resumed = args.workdir / "lora" / "resume.toml"
    resumed.write_text(run_config(args.workdir / "lora", method="lora", steps=2 * args.steps))
    runs["lora resumed to twice the steps"] = train(resumed, args.workdir / "lora" / "resume.log")
    device = torch.cuda.get_device_name()
    args.report.write_text(report_text(device, versions(), runs))
    (args.report.with_suffix(".json")).write_text(
        json.dumps({"device": device, "versions": versions(), "runs": runs}, indent=1)
    )
    print(f"report: {args.report}")
    return 1 if any(run["exit"] for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
