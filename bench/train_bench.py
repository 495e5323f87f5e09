"""Training benchmark: what a user would choose between, our torch engine or TRL's SFTTrainer.

    .venv/bin/python bench/train_bench.py [--shape tiny|1b|8b] [--seq-len 512] [--batch 4] [--steps 10]
        [--warmup 3] [--dtype bfloat16|float32] [--peak-tflops X] [--workdir .bench-train]

One random-weight Llama of the chosen shape and dolly-like generated records of dolly-like lengths
(most far shorter than --seq-len, a long tail truncated at it). Each variant trains LoRA r16 (q_proj,
v_proj) for --warmup + --steps optimizer steps in its own child process, on each data layout: padded
(one example per row, padded to the batch's longest) and packed (several examples per row, trl's
best-fit-decreasing):
  (a) engine-defaults:   llm_pipeline's torch backend with its defaults on this device (train.attention
                         auto, gradient checkpointing off for LoRA, completion-only loss, ...)
  (b) trl-defaults:      trl's SFTTrainer with default arguments on the same model and records (only the
                         batch, length, steps, precision and the layout's packing set to match)
  (c) trl-engine-flags:  trl's SFTTrainer handed the flags the engine resolved in (a): attention kernel,
                         gradient checkpointing, compile, liger, optimizer, completion-only loss
It reports real (non-padding) tokens/s, the median of the timed steps, apart from the warm-up: the first
--warmup steps' seconds (torch.compile and autotuning happen there), MFU (FLOPs per token from the model
config, llm_pipeline.training.metrics, over the device's peak; --peak-tflops where the table has no
entry) and peak memory (CUDA allocations on a GPU, the child's peak RSS on a CPU), and writes
docs/train-benchmark.md (and a chart beside it) with the device, the versions, every timed step and
every figure as JSON. The exit status is 1 when a variant failed. The test suite runs it once at the
tiny shape with one warm-up and one timed step (tests/bench/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
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

KINDS = ("engine-defaults", "trl-defaults", "trl-engine-flags")
LAYOUTS = ("padded", "packed")
TARGET = 1.3  # (a) / (b) real tokens/s on one H100 at the 8B shape, LoRA r16
REPORT = REPO / "docs" / "train-benchmark.md"
CPU_CHART_NOTE = (
    "CPU run: it proves the script, not GPU speed; padded vs packed here (packing slower or faster) says nothing "
    "about a GPU, where packing is the throughput lever"
)
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
    """Dolly-format records with dolly's skew: most responses a fraction of the sequence, a long tail
    past it (those truncate), so padding and packing matter as they do on the real data."""
    import random

    from tools import tiny_model as tiny

    rng = random.Random(0)

    def words(count: int) -> str:
        return " ".join(rng.choice(tiny.WORDS) for _ in range(count))

    with path.open("w") as out:
        for i in range(count):
            response = max(1, min(seq_len, round(rng.lognormvariate(math.log(seq_len / 5), 0.9))))
            record = {
                "instruction": words(8) + "?",
                "context": words(12) if i % 3 == 0 else "",
                "response": words(response),
            }
            out.write(json.dumps(record | {"category": "open_qa"}) + "\n")


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


# -- one variant (child) ------------------------------------------------------------------------
class RealTokens:
    """Wraps a collator; the real (non-padding) tokens of each batch it builds, in order."""

    def __init__(self, collator):
        self.collator = collator
        self.per_batch: list[int] = []

    def __call__(self, features):
        batch = self.collator(features)
        width = batch["input_ids"].shape[-1]
        self.per_batch.append(sum(min(len(feature["input_ids"]), width) for feature in features))
        return batch


def clock_callback(tokens: RealTokens, seconds: list[float], real: list[int]):
    """Times every optimizer step (one micro-batch each); accelerate fetches a batch ahead, so a
    step's tokens are the count of its own batch by position, not the latest one."""
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
            seconds.append(time.perf_counter() - self.started)
            real.append(tokens.per_batch[state.global_step - 1])

    return StepClock()


def engine_config(spec: dict, folder: Path):
    """The run config a user writes: model, data, LoRA and batch; every lever left at its default."""
    from llm_pipeline import config

    raw = {
        "model": {"id": "random-llama", "dtype": spec["dtype"]},
        "data": {
            "dataset": spec["records"],
            "max_length": spec["seq_len"],
            "validation_fraction": 0.0,
            "packing": spec["layout"] == "packed",
        },
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
        },
    }
    return config.from_dict(raw, env={})


def engine_flags(cfg) -> dict:
    """The speed and loss flags the engine resolves for this device, as SFTConfig arguments."""
    from llm_pipeline.training import parts
    from llm_pipeline.training.torch import backend, methods, parallel

    return {
        **parallel.trainer_arguments(cfg, 1),
        "torch_compile": cfg.train.compile,
        "use_liger_kernel": methods.liger_enabled(parts.model_part(cfg)),
        "optim": cfg.train.optimizer,
        "completion_only_loss": backend.completion_only(cfg),
    }


def engine_trainer(spec: dict, folder: Path):
    from llm_pipeline import data
    from llm_pipeline.training import parts
    from llm_pipeline.training.plan import TrainPlan
    from llm_pipeline.training.torch import backend as torch_backend

    cfg = engine_config(spec, folder)
    data.prepare_if_stale(cfg)
    datasets, tokenizer = data.training_inputs(cfg)  # as the train step reads them
    plan = TrainPlan(
        backend="torch",
        max_steps=cfg.train.max_steps,
        logging_steps=10_000,
        save_checkpoints=False,
        resume_from=None,
        start_step=0,
        tensorboard_dir=None,
    )
    trainer, _ = torch_backend.build_trainer(cfg, parts.read(cfg), plan, datasets, tokenizer)
    return trainer


def trl_trainer(spec: dict, folder: Path):
    """(b) SFTTrainer's defaults, or (c) the same trainer handed the engine's resolved flags."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from llm_pipeline.prompt import format_example, prompt_completion
    from llm_pipeline.training import parts
    from llm_pipeline.training.torch import methods

    dtype = getattr(torch, spec["dtype"])
    records = datasets.load_dataset("json", data_files=spec["records"], split="train")
    # trl's own default (its config's gradient_checkpointing = True), by the name transformers 5 reads
    flags, model_kwargs, formatting = {"activation_checkpointing": True}, {"dtype": dtype}, format_example
    if spec["kind"] == "trl-engine-flags":
        cfg = engine_config(spec, folder)
        flags, model_kwargs = engine_flags(cfg), methods.model_kwargs(parts.model_part(cfg))
        if flags["completion_only_loss"]:  # trl labels the prompt -100 on prompt-completion records
            records, formatting = records.map(prompt_completion, remove_columns=records.column_names), None
    args = SFTConfig(  # only what must match the engine: batch, length, layout, steps, precision, no saving
        output_dir=str(folder),
        per_device_train_batch_size=spec["batch"],
        max_length=spec["seq_len"],
        packing=spec["layout"] == "packed",
        max_steps=spec["steps"] + spec["warmup"],
        bf16=spec["dtype"] == "bfloat16",
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        disable_tqdm=True,
        **flags,
    )
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], **model_kwargs),
        args=args,
        train_dataset=records,
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        peft_config=LoraConfig(  # the engine's [lora] values: r 16, alpha 16, dropout 0.05, q_proj and v_proj
            r=16, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        ),
        formatting_func=formatting,
    )


def flags_of(trainer) -> str:
    """The levers a trainer runs with, read back from it (what each variant really chose)."""
    args = trainer.args
    attention = getattr(trainer.model.config, "_attn_implementation", "?")
    loss = "answers" if args.completion_only_loss else "every token"
    if args.completion_only_loss is None:
        loss = "answers" if "completion_mask" in trainer.train_dataset.column_names else "every token"
    return (
        f"attention {attention}, checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
        f"compile {'on' if args.torch_compile else 'off'}, liger {'on' if args.use_liger_kernel else 'off'}, "
        f"loss on {loss}"
    )


def child(spec: dict) -> dict:
    import resource

    import torch
    from transformers import AutoConfig

    from llm_pipeline.training.metrics import device_peak_flops, flops_per_token

    folder = Path(spec["workdir"]) / spec["name"].replace("/", "-")
    shutil.rmtree(folder, ignore_errors=True)
    trainer = engine_trainer(spec, folder) if spec["kind"] == "engine-defaults" else trl_trainer(spec, folder)
    trainer.data_collator = tokens = RealTokens(trainer.data_collator)
    seconds: list[float] = []
    real: list[int] = []
    trainer.add_callback(clock_callback(tokens, seconds, real))
    trainer.train()
    warmup = spec["warmup"]
    samples = [count / took for count, took in zip(real[warmup:], seconds[warmup:], strict=True)]
    tokens_per_second = statistics.median(samples)
    peak = device_peak_flops({"HPL_PEAK_TFLOPS": str(spec["peak_tflops"])} if spec["peak_tflops"] else None)
    flops = flops_per_token(AutoConfig.from_pretrained(spec["model"]), spec["seq_len"], full=False)
    if torch.cuda.is_available():
        memory = torch.cuda.max_memory_allocated()
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "flags": flags_of(trainer),
        "tokens_per_second": tokens_per_second,
        "warmup_s": sum(seconds[:warmup]),
        "mfu": tokens_per_second * flops / peak if peak else None,
        "peak_memory_gb": memory / 1e9,
        "samples": samples,
    }


# -- the run (parent) ---------------------------------------------------------------------------
def run_variant(spec: dict) -> dict:
    print(f"== {spec['name']}", flush=True)
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
    print(
        f"   {result['tokens_per_second']:.1f} real tokens/s, warm-up {result['warmup_s']:.1f} s, "
        f"peak {result['peak_memory_gb']:.2f} GB; {result['flags']}",
        flush=True,
    )
    return result


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        if importlib.util.find_spec(name) is None:
            found[name] = "not installed"
            continue
        try:  # the distribution's version: liger_kernel has no __version__
            found[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            found[name] = getattr(__import__(name), "__version__", "?")
    return found


def variants() -> list[tuple[str, str, str]]:
    """(name, kind, layout) for every variant, in report order."""
    return [(f"{kind}/{layout}", kind, layout) for layout in LAYOUTS for kind in KINDS]


def target_lines(results: dict, device: str, shape: str) -> list[str]:
    lines = []
    on_h100 = "H100" in device and shape == "8b"
    for layout in LAYOUTS:
        engine, plain = results.get(f"engine-defaults/{layout}", {}), results.get(f"trl-defaults/{layout}", {})
        if "tokens_per_second" not in engine or "tokens_per_second" not in plain:
            continue
        ratio = engine["tokens_per_second"] / plain["tokens_per_second"]
        verdict = ("met" if ratio >= TARGET else "NOT met") if on_h100 else "not measured on GPU"
        lines.append(
            f"- {layout}: (a) engine-defaults / (b) trl-defaults = {ratio:.2f}x here; target (a) >= {TARGET}x (b) "
            f"on one H100 at the 8B shape, LoRA r16: {verdict}."
        )
    if not on_h100:
        lines.append(f"- Target (a) >= {TARGET}x (b) on one H100 at the 8B shape, LoRA r16: not measured on GPU.")
    return lines


def write_report(path: Path, settings: dict, device: str, found: dict, results: dict) -> None:
    def cell(result: dict, key: str, fmt: str) -> str:
        value = result.get(key)
        return "n/a" if value is None else format(value, fmt)

    lines = [
        "# Training benchmark: our engine vs TRL",
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
        f"- Data: dolly-like generated records with dolly's skewed lengths, max length {settings['seq_len']}, "
        f"padded (one example a row) or packed; batch {settings['batch']}; {settings['warmup']} warm-up "
        f"step(s) (compile time, reported apart), then {settings['steps']} timed step(s)",
        "- Tokens/s counts real tokens only (padding excluded), so padded and packed rows compare fairly",
        f"- MFU peak: {settings['peak']}",
        "",
        "| variant | flags | real tokens/s (median) | warm-up s | MFU | peak memory (GB) |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        if "error" in result:
            lines.append(f"| {name} | | failed: {result['error']} | | | |")
            continue
        lines.append(
            f"| {name} | {result['flags']} | {result['tokens_per_second']:.1f} | {result['warmup_s']:.3g} | "
            f"{cell(result, 'mfu', '.1%')} | {result['peak_memory_gb']:.2f} |"
        )
    lines += ["", "## Target", "", *target_lines(results, device, settings["shape"])]
    if "CPU" in device:
        lines.append(
            "\nThis is a CPU run: it shows that the script runs every variant end to end and writes this "
            "report; its figures are no claim about GPU training speed."
        )
    lines += ["", "## Every timed step (real tokens/s)", ""]
    for name, result in results.items():
        samples = ", ".join(f"{s:.1f}" for s in result.get("samples", []))
        lines.append(f"- {name}: {samples or 'none'}")
    from llm_pipeline import charts  # matplotlib: only the parent process draws

    chart = path.with_suffix(".png")
    lines += ["", f"Chart: [{chart.name}]({chart.name}) (median tokens/s per variant, every timed step as a dot)."]
    record = {"device": device, "settings": settings, "variants": results}
    lines += ["", "## Every figure (JSON)", "", "```json", json.dumps(record, indent=2), "```"]
    path.write_text("\n".join(lines) + "\n")
    measured = [(name, result.get("tokens_per_second"), result.get("samples", [])) for name, result in results.items()]
    charts.save(
        charts.benchmark_figure(
            measured,
            title=f"training benchmark: {settings['shape']} shape, {device}",
            note=CPU_CHART_NOTE if "CPU" in device else "",
        ),
        chart,
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
    # packed rows hold several examples each: enough records for every packed step
    write_records(args.workdir / "records.jsonl", (args.steps + args.warmup) * args.batch * 8 + 8, args.seq_len)
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
        name: run_variant(base | {"name": name, "kind": kind, "layout": layout}) for name, kind, layout in variants()
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
    write_report(args.report, settings, device_name(), versions(), results)
    shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"report written to {args.report}", flush=True)
    return 0 if all("error" not in result for result in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
