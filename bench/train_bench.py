"""Training benchmark: our torch engine (with its speed levers) vs plain TRL SFTTrainer defaults.

    .venv/bin/python bench/train_bench.py [--shape tiny|1b|8b] [--seq-len 512] [--batch 4] [--steps 10]
        [--warmup 3] [--dtype bfloat16|float32] [--peak-tflops X] [--workdir .bench-train]

One random-weight Llama of the chosen shape and dolly-like generated records long enough that every
example fills --seq-len tokens (no padding: a fixed sequence length and batch for every variant).
Each variant trains LoRA r16 (q_proj, v_proj) for --warmup + --steps optimizer steps in its own
child process, timed per step after the warmup:
  (a) engine:            llm_pipeline's torch backend with every lever this device can run
  (b) trl-defaults:      trl's SFTTrainer with default arguments on the same model, data and batch
  (c) engine-no-levers,  and the engine with one lever at a time (compile, liger_kernel,
      flash_attention_2); a lever this device cannot run is listed as not run, with the reason.
It reports non-padding tokens/s (median of the timed steps), MFU (FLOPs per token from the model
config, llm_pipeline.training.metrics, over the device's peak; --peak-tflops where the table has no
entry) and peak memory (CUDA allocations on a GPU, the child's peak RSS on a CPU), and writes
docs/train-benchmark.md with the device, the versions, every timed step and every figure as JSON.
The exit status is 1 when a variant that this device can run failed. The test suite runs it once at
the tiny shape with one step (tests/bench/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "payloads")]

from bench.synthetic_llama import SHAPES, LlamaShape, hf_config  # noqa: E402

LEVERS = ("compile", "liger_kernel", "flash_attention_2")
TARGET = 1.3  # (a) / (b) tokens/s on one H100 at the 8B shape, LoRA r16
REPORT = REPO / "docs" / "train-benchmark.md"
VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "liger_kernel", "flash_attn")


# -- setup (parent) -----------------------------------------------------------------------------
def write_model(folder: Path, shape: LlamaShape, dtype: str) -> None:
    import torch
    from transformers import LlamaForCausalLM

    from tools import tiny_model as tiny

    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(hf_config(shape, dtype)).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tiny.build_tokenizer().save_pretrained(folder)


def write_records(path: Path, count: int, seq_len: int) -> None:
    """Dolly-format records whose response alone is longer than the sequence: every example truncates."""
    import random

    from tools import tiny_model as tiny

    rng = random.Random(0)

    def words(count: int) -> str:
        return " ".join(rng.choice(tiny.WORDS) for _ in range(count))

    with path.open("w") as out:
        for i in range(count):
            record = {
                "instruction": words(8) + "?",
                "context": words(12) if i % 3 == 0 else "",
                "response": words(seq_len),
            }
            out.write(json.dumps(record | {"category": "open_qa"}) + "\n")


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def lever_unavailable(lever: str) -> str | None:
    """Why this device cannot run a lever, or None."""
    import torch

    cuda = torch.cuda.is_available()
    if lever == "compile":
        return None if cuda or shutil.which("g++") else "torch.compile on CPU needs a C++ compiler"
    if lever == "liger_kernel":
        if not cuda:
            return "liger-kernel is Triton code: CUDA only"
        return None if importlib.util.find_spec("liger_kernel") else "liger-kernel is not installed"
    if not cuda:
        return "flash-attn is CUDA only"
    return None if importlib.util.find_spec("flash_attn") else "flash-attn is not installed"


# -- one variant (child) ------------------------------------------------------------------------
def clock_callback(tokens_per_step: int, warmup: int, samples: list[float]):
    import torch
    from transformers import TrainerCallback

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            if state.global_step > warmup:
                samples.append(tokens_per_step / (time.perf_counter() - self.started))

    return StepClock()


def engine_trainer(spec: dict, folder: Path):
    from llm_pipeline import config, data
    from llm_pipeline.training.plan import TrainPlan
    from llm_pipeline.training.torch import backend as torch_backend

    levers = spec["levers"]
    raw = {
        "model": {"id": "random-llama", "dtype": spec["dtype"]},
        "data": {"dataset": spec["records"], "max_length": spec["seq_len"], "validation_fraction": 0.0},
        "paths": {"model_dir": spec["model"], "output_dir": str(folder), "compile_cache_dir": str(folder)},
        "lora": {"r": 16, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
        "parallel": {"devices_per_node": 1, "tensor_parallel_size": 1},
        "train": {
            "backend": "torch",
            "method": "lora",
            "per_device_batch_size": spec["batch"],
            "gradient_accumulation_steps": 1,
            "max_steps": spec["steps"] + spec["warmup"],
            "bf16": spec["dtype"] == "bfloat16",
            "logging_steps": 10_000,
            "compile": "compile" in levers,
            "liger_kernel": "liger_kernel" in levers,
            "attention": "flash_attention_2" if "flash_attention_2" in levers else "sdpa",
        },
    }
    cfg = config.from_dict(raw, env={})
    datasets, tokenizer = data.training_inputs(cfg, may_prepare=True)  # as the train step reads them
    plan = TrainPlan(
        backend="torch",
        max_steps=cfg.train.max_steps,
        logging_steps=10_000,
        save_checkpoints=False,
        resume_from=None,
        start_step=0,
        tensorboard_dir=None,
    )
    trainer, _ = torch_backend.build_trainer(cfg, plan, datasets, tokenizer)
    return trainer


def trl_defaults_trainer(spec: dict, folder: Path):
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from llm_pipeline.prompt import format_example

    dtype = getattr(torch, spec["dtype"])
    args = SFTConfig(  # only what must match the engine: batch, length, steps, precision, no saving/logging
        output_dir=str(folder),
        per_device_train_batch_size=spec["batch"],
        max_length=spec["seq_len"],
        max_steps=spec["steps"] + spec["warmup"],
        bf16=spec["dtype"] == "bfloat16",
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        disable_tqdm=True,
    )
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype),
        args=args,
        train_dataset=datasets.load_dataset("json", data_files=spec["records"], split="train"),
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        peft_config=LoraConfig(  # the engine's [lora] values: r 16, alpha 16, dropout 0.05, q_proj and v_proj
            r=16, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        ),
        formatting_func=format_example,
    )


def child(spec: dict) -> dict:
    import resource

    import torch
    from transformers import AutoConfig

    from llm_pipeline.training.metrics import device_peak_flops, flops_per_token

    folder = Path(spec["workdir"]) / spec["name"]
    shutil.rmtree(folder, ignore_errors=True)
    trainer = trl_defaults_trainer(spec, folder) if spec["name"] == "trl-defaults" else engine_trainer(spec, folder)
    samples: list[float] = []
    trainer.add_callback(clock_callback(spec["batch"] * spec["seq_len"], spec["warmup"], samples))
    trainer.train()
    tokens_per_second = statistics.median(samples)
    peak = device_peak_flops({"HPL_PEAK_TFLOPS": str(spec["peak_tflops"])} if spec["peak_tflops"] else None)
    flops = flops_per_token(AutoConfig.from_pretrained(spec["model"]), spec["seq_len"], full=False)
    if torch.cuda.is_available():
        memory = torch.cuda.max_memory_allocated()
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "tokens_per_second": tokens_per_second,
        "mfu": tokens_per_second * flops / peak if peak else None,
        "peak_memory_gb": memory / 1e9,
        "samples": samples,
    }


# -- the run (parent) ---------------------------------------------------------------------------
def run_variant(spec: dict) -> dict:
    print(f"== {spec['name']}: levers {', '.join(spec['levers']) or 'none'}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, cwd=REPO
    )
    print(f"   ran {time.perf_counter() - started:.0f} s (start-up, setup and every step)", flush=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr)[-2000:]
        return {"error": f"exit {done.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"}
    result = json.loads(lines[-1][len("RESULT ") :])
    print(f"   {result['tokens_per_second']:.1f} tokens/s, peak {result['peak_memory_gb']:.2f} GB", flush=True)
    return result


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        if importlib.util.find_spec(name) is None:
            found[name] = "not installed"
            continue
        module = __import__(name)
        found[name] = getattr(module, "__version__", "?")
    return found


def variants(available: list[str]) -> list[tuple[str, list[str]]]:
    chosen = [("engine", available), ("trl-defaults", []), ("engine-no-levers", [])]
    return chosen + [(f"engine+{lever}", [lever]) for lever in available]


def write_report(path: Path, settings: dict, device: str, found: dict, results: dict, skipped: dict) -> None:
    def cell(result: dict, key: str, fmt: str) -> str:
        value = result.get(key)
        return "n/a" if value is None else format(value, fmt)

    lines = [
        "# Training benchmark: our engine vs plain TRL",
        "",
        "Written by `bench/train_bench.py` (do not edit by hand; rerun it). Command:",
        "",
        f"    .venv/bin/python bench/train_bench.py {settings['command']}",
        "",
        f"- Device: {device}; load average at the end {settings['load']} (other work on the host inflates "
        "the spread between steps)",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in found.items())}",
        f"- Model: random-weight Llama, shape `{settings['shape']}` ({settings['shape_detail']}), "
        f"{settings['dtype']}; LoRA r16 on q_proj and v_proj; one process",
        f"- Data: dolly-like generated records, every example {settings['seq_len']} tokens (no padding); "
        f"batch {settings['batch']}; {settings['warmup']} warmup step(s), then {settings['steps']} timed step(s)",
        f"- MFU peak: {settings['peak']}",
        "",
        "| variant | levers | tokens/s (median) | MFU | peak memory (GB) |",
        "|---|---|---|---|---|",
    ]
    for name, (levers, result) in results.items():
        if "error" in result:
            lines.append(f"| {name} | {', '.join(levers) or 'none'} | failed: {result['error']} | | |")
            continue
        lines.append(
            f"| {name} | {', '.join(levers) or 'none'} | {result['tokens_per_second']:.1f} | "
            f"{cell(result, 'mfu', '.1%')} | {result['peak_memory_gb']:.2f} |"
        )
    for lever, reason in skipped.items():
        lines.append(f"| engine+{lever} | {lever} | not run: {reason} | | |")
    engine, plain = results.get("engine", (None, {}))[1], results.get("trl-defaults", (None, {}))[1]
    ratio = (
        engine["tokens_per_second"] / plain["tokens_per_second"]
        if "tokens_per_second" in engine and "tokens_per_second" in plain
        else None
    )
    lines += ["", "## Target", ""]
    on_h100 = "H100" in device and settings["shape"] == "8b"
    if ratio is not None:
        lines.append(f"Measured here: (a) engine / (b) trl-defaults = {ratio:.2f}x on this device and shape.")
    if on_h100 and ratio is not None:
        lines.append(
            f"Target (a) >= {TARGET}x (b) on one H100 at the 8B shape: {'met' if ratio >= TARGET else 'NOT met'}."
        )
    else:
        lines.append(f"Target (a) >= {TARGET}x (b) on one H100 at the 8B shape, LoRA r16: not measured on GPU.")
    same = [name for name, (levers, _) in results.items() if name != "engine" and levers == results["engine"][0]]
    if same:
        lines.append(
            f"`engine` and `{same[0]}` run the same configuration: the gap between them is this host's "
            "run-to-run spread, the floor under which no difference above means anything."
        )
    if "CPU" in device:
        lines.append(
            "This is a CPU run: it shows that the script runs every variant end to end and writes this "
            "report; its figures are no claim about GPU training speed."
        )
    lines += ["", "## Every timed step (tokens/s)", ""]
    for name, (_, result) in results.items():
        samples = ", ".join(f"{s:.1f}" for s in result.get("samples", []))
        lines.append(f"- {name}: {samples or 'none'}")
    from llm_pipeline import charts  # matplotlib: only the parent process draws

    chart = path.with_suffix(".png")
    lines += ["", f"Chart: [{chart.name}]({chart.name}) (median tokens/s per variant, every timed step as a dot)."]
    record = {
        "device": device,
        "settings": settings,
        "variants": {name: {"levers": levers, **result} for name, (levers, result) in results.items()},
        "not_run": skipped,
    }
    lines += ["", "## Every figure (JSON)", "", "```json", json.dumps(record, indent=2), "```"]
    path.write_text("\n".join(lines) + "\n")
    measured = [
        (name, result.get("tokens_per_second"), result.get("samples", [])) for name, (_, result) in results.items()
    ]
    charts.save(
        charts.benchmark_figure(measured, title=f"training benchmark: {settings['shape']} shape, {device}"), chart
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/train_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps (compilation, allocator)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on CUDA")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: the table)")
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench-train")
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0

    import torch

    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    shape = SHAPES[args.shape]
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    print(f"writing a random {args.shape} Llama ({dtype}) and records under {args.workdir}", flush=True)
    write_model(args.workdir / "model", shape, dtype)
    write_records(args.workdir / "records.jsonl", (args.steps + args.warmup) * args.batch + 8, args.seq_len)
    skipped = {lever: reason for lever in LEVERS if (reason := lever_unavailable(lever))}
    available = [lever for lever in LEVERS if lever not in skipped]
    base = {
        "model": str(args.workdir / "model"),
        "records": str(args.workdir / "records.jsonl"),
        "workdir": str(args.workdir),
        "seq_len": args.seq_len,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "dtype": dtype,
        "peak_tflops": args.peak_tflops,
    }
    results = {
        name: (levers, run_variant(base | {"name": name, "levers": levers})) for name, levers in variants(available)
    }
    from llm_pipeline.training.metrics import device_peak_flops

    peak = device_peak_flops({"HPL_PEAK_TFLOPS": str(args.peak_tflops)} if args.peak_tflops else None)
    settings = {
        "command": " ".join(argv if argv is not None else sys.argv[1:]),
        "shape": args.shape,
        "shape_detail": ", ".join(f"{k} {v}" for k, v in asdict(shape).items()),
        "dtype": dtype,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "load": " / ".join(f"{value:.1f}" for value in os.getloadavg()),
        "peak": f"{peak / 1e12:g} TFLOP/s" if peak else "unknown for this device: MFU not reported (--peak-tflops)",
    }
    write_report(args.report, settings, device_name(), versions(), results, skipped)
    shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"report written to {args.report}", flush=True)
    return 0 if all("error" not in result for _, result in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
