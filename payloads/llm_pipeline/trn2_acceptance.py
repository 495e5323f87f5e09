"""First-node acceptance of the Trainium2 lane: one command on a user's first trn2 node (about 30 min),
PASS, FAIL or SKIP per check, and a report (acceptance.json and acceptance.md in --report-dir).

    python -m llm_pipeline.trn2_acceptance --report-dir DIR --tiny-config TINY.toml \\
        [--lora-config configs/llama3-8b-lora-trn2.toml] [--offline]

Checks, in order:
- device: torch's accelerator is `neuron`, with its device count, and a matmul on it matches the CPU's;
- tiny-parity: a tiny Llama learns a fixed token cycle for 20 steps on one rank on the device and on the
  CPU from the same seed (llm_pipeline.training.tiny_task): the device run must hold its parameters and
  loss on the device, halve its loss, and match the CPU's losses step by step within PARITY_RTOL;
- graph-count: the NEFF files in TorchNeuron's cache (TORCH_NEURONX_NEFF_CACHE_DIR) stop growing after
  WARMUP_STEPS of that run: each new shape would be a new compile;
- cpu-fallbacks: the operators TorchNeuron ran on the CPU during that run, counted and named from the
  warnings and log records that report a fallback (informational: it passes with what it found);
- resume: the engine (llm_pipeline.train) on --tiny-config saves at step 20, stops, resumes to 30, and
  its losses equal the uninterrupted run's (RESUME_ATOL, as tests/payloads/test_train_stop.py);
- ranks: every rank of one node (the partition's devices per node, deploy-facts.json) prints its host,
  device and NeuronCores; two ranks on one device FAIL;
- lora-8b: --lora-config (Llama 3 8B LoRA) trains 50 steps on all the node's ranks; its trainable count
  is the expected one and its samples/s is reported beside trn1's TRN1_SAMPLES_PER_SECOND (seed 000);
- two-node: the same config trains 10 steps over EFA on two nodes (inside a two-node Slurm allocation).
The multi-rank checks launch themselves (llm_pipeline.jobs.acceptance_launch): one node per torchrun for
the one-node checks even inside ``salloc -N 2``, the ranks a node from the deploy's facts.

Off a Neuron host the device checks SKIP with "not a Neuron host" and the 8B and two-node checks with
"needs a trn2 node"; the tiny CPU reference (which must learn) and the resume check still run, so the
command cannot rot (tests/payloads/test_trn2_acceptance.py runs it on CPU). Exit 0 when nothing FAILed
and nothing was skipped; a skipped check exits 1 unless --offline says skipping the hardware is intended.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import acceptance_launch
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import CHECKPOINT, ProgressLine, TrainableLine
from llm_pipeline.training import tiny_task

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NOT_NEURON = "not a Neuron host"
NEEDS_NODE = "needs a trn2 node"
PAYLOADS_DIR = Path(__file__).resolve().parents[1]  # deploy-facts.json lies here on the cluster
WARMUP_STEPS = 3  # the first steps compile (forward, backward, optimizer); later ones must not
RESUME_SAVE, RESUME_END = 20, 30
RESUME_ATOL = 1e-3
LORA_STEPS, TWO_NODE_STEPS = 50, 10
# trn1.32xlarge, optimum-neuron, the blog's Llama 3 8B LoRA run (seed 000): samples/s per data-parallel
# replica, 4 replicas (TP 8) per node. Our progress lines print the node's whole rate beside it.
TRN1_SAMPLES_PER_SECOND = 3.554
TRN1_REPLICAS = 4
NEFF_CACHE_VARIABLE = "TORCH_NEURONX_NEFF_CACHE_DIR"
# The Neuron docs say unsupported ATen ops fall back to the CPU by default (TorchNeuron best practices,
# Neuron SDK 2.33) but quote no message text, so these words and the aten:: names are a guess at it,
# unconfirmed until the first node shows what torch-neuronx prints; the check's detail says so.
FALLBACK_WORDS = re.compile(r"fall(?:s|ing)?[ -]?back|fallback", re.IGNORECASE)
FALLBACK_PATTERN_NOTE = "the match on 'fall back' and aten:: names is unconfirmed until torch-neuronx's text is seen"
OPERATOR = re.compile(r"aten::[A-Za-z0-9_.]+")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    figures: dict = field(default_factory=dict)


def accelerator() -> str:
    from llm_pipeline.training import device

    return device.accelerator_type()


def check_device(kind: str) -> Check:
    if kind != "neuron":
        return Check("device", SKIP, NOT_NEURON)
    import torch

    return matmul_check("neuron", torch.accelerator.device_count())


def matmul_check(device_name: str, count: int, matmul_dtype=None) -> Check:
    """The device's matmul against the CPU's, within the bound set for bf16 matmuls (tiny_task.MATMUL_RTOL)."""
    difference = tiny_task.matmul_difference(device_name, matmul_dtype)
    agrees = difference <= tiny_task.MATMUL_RTOL
    size = tiny_task.MATMUL_SIZE
    detail = (
        f"{count} NeuronCore(s) visible; a {size}x{size} matmul is {difference:.4f} off the CPU's "
        f"(bound {tiny_task.MATMUL_RTOL:.4f}, set for bf16 matmuls)"
    )
    figures = {"devices": count, "matmul_difference": difference, "bound": tiny_task.MATMUL_RTOL}
    return Check("device", PASS if agrees and count > 0 else FAIL, detail, figures)


def neff_count() -> int:
    folder = os.environ.get(NEFF_CACHE_VARIABLE)
    return sum(1 for _ in Path(folder).rglob("*.neff")) if folder and Path(folder).is_dir() else 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def train_tiny(
    device_name: str, *, steps: int = tiny_task.STEPS, seed: int = 0, mutate=None, matmul_dtype=None
) -> tiny_task.TinyRun:
    """The tiny task on ``device_name``, with the NEFF count after each step and the fallback reports seen."""
    count = (lambda run: run.graphs.append(neff_count())) if device_name != "cpu" else None
    records = _Records()
    logging.getLogger().addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = tiny_task.train(
                device_name, steps=steps, seed=seed, mutate=mutate, after_step=count, matmul_dtype=matmul_dtype
            )
    finally:
        logging.getLogger().removeHandler(records)
    seen = [str(w.message) for w in caught] + records.messages
    run.fallbacks = [message for message in seen if FALLBACK_WORDS.search(message)]
    return run


def parity_check(kind: str, reference: tiny_task.TinyRun, run: tiny_task.TinyRun) -> Check:
    passed, line, figures = tiny_task.verdict(kind, reference, run)
    return Check("tiny-parity", PASS if passed else FAIL, line, figures)


def check_tiny(kind: str, report: Path, *, device_run=None) -> list[Check]:
    """The CPU reference (it must learn, or the task itself is broken), then the device run against it.
    ``device_run`` stands in for the device's run (the tests' broken devices)."""
    cpu = train_tiny("cpu")
    reference = {"cpu_losses": cpu.losses}
    trained = f"loss {cpu.losses[0]:.4f} -> {cpu.losses[-1]:.4f}"
    if not tiny_task.learned(cpu.losses):
        return [Check("tiny-parity", FAIL, f"the CPU reference did not learn the task ({trained})", reference)]
    if kind != "neuron" and device_run is None:
        detail = f"{NOT_NEURON} (the CPU reference learned in {tiny_task.STEPS} steps, {trained})"
        return [
            Check("tiny-parity", SKIP, detail, reference),
            Check("graph-count", SKIP, NOT_NEURON),
            Check("cpu-fallbacks", SKIP, NOT_NEURON),
        ]
    run = device_run if device_run is not None else train_tiny(kind)
    settled = run.graphs[WARMUP_STEPS - 1 :]
    graphs = Check(
        "graph-count",
        PASS if settled and len(set(settled)) == 1 and settled[0] > 0 else FAIL,
        f"NEFF files after each step: {run.graphs} (steady from step {WARMUP_STEPS} on: {len(set(settled)) == 1})",
        {"neff_files_per_step": run.graphs, "cache": os.environ.get(NEFF_CACHE_VARIABLE, "")},
    )
    return [parity_check(kind, cpu, run), graphs, fallback_check(run.fallbacks)]


def fallback_check(messages: list[str]) -> Check:
    """Informational: the fallback reports seen and the operators they name, with the pattern's caveat."""
    operators = sorted({name for message in messages for name in OPERATOR.findall(message)})
    return Check(
        "cpu-fallbacks",
        PASS,
        f"{len(messages)} fallback report(s); operators: {', '.join(operators) or 'none named'} "
        f"({FALLBACK_PATTERN_NOTE})",
        {"operators": operators, "messages": messages[:50], "pattern": FALLBACK_WORDS.pattern, "confirmed": False},
    )


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def run_config(path: Path, folder: Path, **sections):
    """The config at ``path`` with some keys changed and its outputs under ``folder``."""
    from llm_pipeline import config

    raw = _merge(config.read_toml(path), {"paths": {"output_dir": str(folder)}, **sections})
    return config.from_dict(raw, base_dir=path.parent)


def logged_losses(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def check_resume(tiny_config: Path | None, report: Path) -> Check:
    """Save at 20, stop, resume to 30 through the engine, against the run that never stopped."""
    if tiny_config is None:
        return Check("resume", SKIP, "no --tiny-config given")
    from llm_pipeline import data as data_step
    from llm_pipeline import train

    shape = {"max_steps": RESUME_END, "save_steps": RESUME_SAVE // 2, "logging_steps": 1, "warmup_steps": 1}
    data = {"packing": False, "validation_fraction": 0.0}  # one shape a batch on neuron
    whole = run_config(tiny_config, report / "resume-whole", train=shape, data=data)
    data_step.prepare(whole)  # the train step only trains: the data step first, as a chain runs them
    train.train(whole)
    stopped = run_config(
        tiny_config, report / "resume-stopped", train={**shape, "stop_after_step": RESUME_SAVE}, data=data
    )
    data_step.prepare(stopped)
    train.train(stopped)
    train.train(run_config(tiny_config, report / "resume-stopped", train=shape, data=data))
    expected = logged_losses(whole.paths.checkpoints_dir / CHECKPOINT.name(RESUME_END))
    resumed = logged_losses(stopped.paths.checkpoints_dir / CHECKPOINT.name(RESUME_END))
    after = range(RESUME_SAVE + 1, RESUME_END + 1)
    worst = max(abs(resumed[step] - expected[step]) for step in after)
    return Check(
        "resume",
        PASS if worst <= RESUME_ATOL else FAIL,
        f"saved at {RESUME_SAVE}, stopped, resumed to {RESUME_END}: largest loss difference {worst:.2e} on steps "
        f"{RESUME_SAVE + 1}-{RESUME_END} (tolerance {RESUME_ATOL})",
        {"uninterrupted": [expected[s] for s in after], "resumed": [resumed[s] for s in after]},
    )


def rank_probe() -> int:
    """One rank of the rank check (under torchrun): the device accelerate gives the Trainer, as torch
    resolves it, and the NeuronCores the runtime shows this process."""
    import socket

    import torch
    from accelerate import PartialState

    state = PartialState()
    device = torch.empty(1, device=state.device).device
    line = acceptance_launch.probe_line(os.environ, socket.gethostname(), str(device)) + "\n"
    os.write(sys.stdout.fileno(), line.encode())  # one write: 64 ranks share the pipe, lines must not interleave
    state.wait_for_everyone()  # no rank leaves while another still sets up its connections
    state.destroy_process_group()
    return 0


def check_ranks(kind: str, *, env=os.environ, payloads_dir: Path = PAYLOADS_DIR) -> Check:
    """Every rank of one node on its own device: the probe under the acceptance's own launch."""
    if kind != "neuron":
        return Check("ranks", SKIP, NEEDS_NODE)
    try:
        launcher = acceptance_launch.torchrun(env, payloads_dir, nodes=1)
        wanted = acceptance_launch.ranks_per_node(env, payloads_dir)
        out = run_launched([*launcher, "-m", "llm_pipeline.trn2_acceptance", "--rank-probe"])
    except (PipelineError, RuntimeError, OSError) as error:  # OSError: no srun or torchrun here
        return Check("ranks", FAIL, str(error))
    return ranks_verdict(acceptance_launch.read_probes(out), wanted)


def ranks_verdict(probes: list[dict], wanted: int) -> Check:
    shared = acceptance_launch.duplicates(probes)
    places = sorted(f"{p['rank']}:{p['device']}[{p['cores'] or '-'}]" for p in probes)
    problems = shared + ([f"{len(probes)} of {wanted} ranks reported"] if len(probes) != wanted else [])
    detail = f"{len(probes)} rank(s): {', '.join(places)}" + (": " + "; ".join(problems) if problems else "")
    return Check("ranks", FAIL if problems else PASS, detail, {"probes": probes})


def run_launched(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def check_lora(kind: str, lora_config: Path, report: Path, *, nodes: int, env=os.environ) -> Check:
    name = "lora-8b" if nodes == 1 else "two-node"
    steps = LORA_STEPS if nodes == 1 else TWO_NODE_STEPS
    if kind != "neuron":
        return Check(name, SKIP, NEEDS_NODE if nodes == 1 else f"{NEEDS_NODE} (two, in a Slurm allocation)")
    keys = {
        ("parallel", "nodes"): nodes,
        ("train", "max_steps"): steps,
        ("train", "logging_steps"): 1,
        ("train", "save_checkpoints"): False,
        ("train", "global_batch_size"): 0,
    }
    path = write_derived(lora_config, report / f"{name}.toml", keys, run_dir=report / name)  # the TOML editor
    try:
        launcher = acceptance_launch.torchrun(env, PAYLOADS_DIR, nodes=nodes)
        out = run_launched([*launcher, "-m", "llm_pipeline.train", "--config", str(path)])
    except (PipelineError, RuntimeError, OSError) as error:  # OSError: no srun or torchrun here
        return Check(name, FAIL, str(error))
    rates = [line.samples_per_second for line in ProgressLine.parse_all(out)]
    trainable = TrainableLine.find(out)
    figures = {"samples_per_second": rates[-1] if rates else None, "trn1_samples_per_second": TRN1_SAMPLES_PER_SECOND}
    if trainable:
        figures["trainable"] = trainable.trainable
    ok = bool(rates) and trainable is not None
    detail = (
        f"{steps} steps on {nodes} node(s); trainable {figures.get('trainable', 'not reported')}; "
        f"{figures['samples_per_second']} samples/s (trn1, seed 000: {TRN1_SAMPLES_PER_SECOND} per replica x "
        f"{TRN1_REPLICAS} = {TRN1_SAMPLES_PER_SECOND * TRN1_REPLICAS:.3f} per node)"
    )
    return Check(name, PASS if ok else FAIL, detail, figures)


def write_report(checks: list[Check], report: Path, kind: str) -> None:
    report.mkdir(parents=True, exist_ok=True)
    summary = {"accelerator": kind, "checks": [asdict(check) for check in checks]}
    (report / "acceptance.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        "# Trainium2 first-node acceptance",
        "",
        f"accelerator: {kind}",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {c.name} | {c.status} | {c.detail.replace('|', '/')} |" for c in checks]
    (report / "acceptance.md").write_text("\n".join(lines) + "\n")


def run(report: Path, *, tiny_config: Path | None, lora_config: Path, kind: str | None = None) -> list[Check]:
    kind = accelerator() if kind is None else kind
    report.mkdir(parents=True, exist_ok=True)
    checks = [check_device(kind), *check_tiny(kind, report), check_resume(tiny_config, report), check_ranks(kind)]
    checks += [check_lora(kind, lora_config, report, nodes=1), check_lora(kind, lora_config, report, nodes=2)]
    write_report(checks, report, kind)
    for check in checks:
        print(f"{check.status:4}  {check.name:13}  {check.detail}", flush=True)
    return checks


def outcome(checks: list[Check], *, offline: bool) -> tuple[int, str]:
    """The exit code and its line: a FAIL fails; a SKIP fails too unless --offline says it is intended."""
    failed = [check.name for check in checks if check.status == FAIL]
    skipped = [check.name for check in checks if check.status == SKIP]
    if failed:
        return 1, f"FAIL: {', '.join(failed)}"
    if skipped and not offline:
        return (
            1,
            f"SKIPPED: {', '.join(skipped)}; a first-node acceptance must run them (--offline: skipping is intended)",
        )
    return 0, "no check failed" + (f" ({len(skipped)} skipped, --offline)" if skipped else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report-dir", type=Path, help="where acceptance.json and .md go")
    parser.add_argument("--tiny-config", type=Path, help="a tiny model's run config for the resume check")
    default_lora = PAYLOADS_DIR / "configs" / "llama3-8b-lora-trn2.toml"
    parser.add_argument("--lora-config", type=Path, default=default_lora, help="the 8B LoRA run config")
    parser.add_argument("--offline", action="store_true", help="skipped hardware checks are intended (no trn2 here)")
    parser.add_argument("--rank-probe", action="store_true", help=argparse.SUPPRESS)  # one rank of the ranks check
    args = parser.parse_args(argv)
    if args.rank_probe:
        return rank_probe()
    if args.report_dir is None:
        parser.error("--report-dir is required")
    checks = run(args.report_dir, tiny_config=args.tiny_config, lora_config=args.lora_config)
    code, line = outcome(checks, offline=args.offline)
    print(f"{line}; report in {args.report_dir}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
