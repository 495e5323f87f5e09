"""Acceptance of the Trainium2 lane on a user's first two trn2 nodes (about 30 min): PASS, FAIL or SKIP per
check, a verdict table (each check, its figure, its bound) and a report (acceptance.json and .md).

From the host, inside a two-node allocation of the trn2 partition (every level is an srun into the image,
llm_pipeline.jobs.acceptance_launch):

    salloc -p <trn2 partition> -N 2
    PYTHONPATH=<payloads> python3 -m llm_pipeline.trn2_acceptance --report-dir DIR --tiny-config TINY.toml

Levels and checks, in order:
- node (one srun on the first node, ``--on-node``): device (torch's accelerator is `neuron`, LNC as the
  ranks assume, a matmul within tiny_task.MATMUL_RTOL of the CPU's); tiny-parity (a tiny Llama learns a
  token cycle on the device and matches the CPU run step by step, tiny_task); graph-count (the NEFF files
  in TorchNeuron's cache, TORCH_NEURONX_NEFF_CACHE_DIR, which the image sets, stop growing after
  WARMUP_STEPS); cpu-fallbacks (informational); resume (the engine saves, stops, resumes and matches);
  ranks and collectives (every rank on its own device; all-reduce and all-gather of known values, bus
  bandwidth); lora-8b (50 steps of the 8B LoRA config on the node's ranks: the loss must fall by the margin
  fleet_reference takes from the CPU reference curve, never rise, stay flat or go NaN; samples/s and device
  memory beside the type's figures);
- collectives-2-nodes: the same collectives over EFA on both nodes;
- two-node: 10 steps of the same config on both nodes, judged as lora-8b.

Off a Neuron host (``--on-node`` on a CPU) the device checks SKIP with "not a Neuron host" and the node's
multi-rank checks with "needs a trn2 node"; the tiny CPU reference and the resume check still run, so the
command cannot rot (tests/payloads/test_trn2_acceptance.py). Exit 0 when nothing FAILed and nothing was
skipped; a skipped check exits 1 unless --offline says skipping the hardware is intended.
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
from llm_pipeline.training import fleet_reference, tiny_task

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NOT_NEURON = "not a Neuron host"
NEEDS_NODE = "needs a trn2 node"
PAYLOADS_DIR = Path(__file__).resolve().parents[1]  # deploy-facts.json lies here on the cluster
WARMUP_STEPS = 3  # the first steps compile (forward, backward, optimizer); later ones must not
RESUME_SAVE, RESUME_END = 20, 30
RESUME_ATOL = 1e-3
LORA_STEPS, TWO_NODE_STEPS = 50, 10
TRN2_TYPE = "ml.trn2.48xlarge"  # the type the fleet levels' references are for (fleet_reference.REFERENCES)
NODE_REPORT = "node"  # the one-node levels' report, read back by the host
NEFF_CACHE_VARIABLE = "TORCH_NEURONX_NEFF_CACHE_DIR"
# The Neuron runtime's logical NeuronCore size (Neuron runtime configuration docs); unset is 2 on Trn2.
LNC_VARIABLE, ASSUMED_LNC = "NEURON_LOGICAL_NC_CONFIG", "2"
COLLECTIVE_PREFIX = "COLLECTIVE "
COLLECTIVE_ELEMENTS = 1024
# The bus-bandwidth all-reduce: 256 MiB on the device (large enough to reach the link's rate), 1 MiB on CPU.
BUS_BYTES_DEVICE, BUS_BYTES_CPU, BUS_ITERATIONS = 256 * 2**20, 2**20, 5
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


def check_device(kind: str, env=os.environ) -> Check:
    if kind != "neuron":
        return Check("device", SKIP, NOT_NEURON)
    import torch

    check = matmul_check("neuron", torch.accelerator.device_count())
    lnc, problem = read_lnc(env)
    check.figures["lnc"] = lnc
    if problem:
        check.status, check.detail = FAIL, f"{check.detail}; {problem}"
    return check


def read_lnc(env) -> tuple[str, str]:
    """(the logical NeuronCore size the runtime runs at, a problem line or ""): the partition's ranks a node
    (stacks/accelerators.py) count trn2 at LNC=2, so any other size gives the ranks the wrong cores."""
    value = env.get(LNC_VARIABLE, ASSUMED_LNC)
    if value == ASSUMED_LNC:
        return value, ""
    return value, f"{LNC_VARIABLE}={value}, but the partition's ranks a node assume LNC={ASSUMED_LNC}: unset it"


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
    """One rank of the rank and collective checks (under torchrun): the device accelerate gives the Trainer,
    as torch resolves it, and the NeuronCores the runtime shows this process; then the collectives."""
    import socket

    import torch
    from accelerate import PartialState

    state = PartialState()
    device = torch.empty(1, device=state.device).device
    line = acceptance_launch.probe_line(os.environ, socket.gethostname(), str(device)) + "\n"
    os.write(sys.stdout.fileno(), line.encode())  # one write: 64 ranks share the pipe, lines must not interleave
    record = collective_probe(device, socket.gethostname())
    os.write(sys.stdout.fileno(), (COLLECTIVE_PREFIX + json.dumps(record, sort_keys=True) + "\n").encode())
    state.wait_for_everyone()  # no rank leaves while another still sets up its connections
    state.destroy_process_group()
    return 0


def collective_probe(device, host: str) -> dict:
    """All-reduce and all-gather of known values on this rank, then the all-reduce's bus bandwidth.
    Rank r sends r + 1 (the sum over n ranks is n(n+1)/2) and gathers every rank's r."""
    import time

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.full((COLLECTIVE_ELEMENTS,), float(rank + 1), device=device)
    dist.all_reduce(total)
    reduce_error = float((total.cpu() - world * (world + 1) / 2).abs().max())
    pieces = [torch.empty(COLLECTIVE_ELEMENTS, device=device) for _ in range(world)]
    dist.all_gather(pieces, torch.full((COLLECTIVE_ELEMENTS,), float(rank), device=device))
    gather_error = max(float((piece.cpu() - source).abs().max()) for source, piece in enumerate(pieces))
    size = BUS_BYTES_DEVICE if device.type != "cpu" else BUS_BYTES_CPU
    buffer = torch.ones(size // 4, device=device)
    dist.all_reduce(buffer)  # warm-up: connections and, on Neuron, the compile
    dist.barrier()
    start = time.perf_counter()
    for _ in range(BUS_ITERATIONS):
        dist.all_reduce(buffer)
    float(buffer[0].cpu())  # waits for the device
    seconds = (time.perf_counter() - start) / BUS_ITERATIONS
    # Bus bandwidth as nccl-tests defines it for all-reduce: bytes x 2(n-1)/n over the time.
    bus_gbps = size * 8 * 2 * (world - 1) / world / seconds / 1e9 if world > 1 else 0.0
    return {
        "host": host,
        "rank": rank,
        "world": world,
        "all_reduce_error": reduce_error,
        "all_gather_error": gather_error,
        "bus_gbps": bus_gbps,
        "bytes": size,
    }


def collectives_verdict(records: list[dict], wanted: int, *, nodes: int, reference: tuple | None = None) -> Check:
    """Every rank reported, every value exact; the slowest rank's bus bandwidth beside the type's figure."""
    name = "collectives" if nodes == 1 else "collectives-2-nodes"
    wrong = [r["rank"] for r in records if r["all_reduce_error"] > 0 or r["all_gather_error"] > 0]
    problems = [f"rank(s) {', '.join(map(str, sorted(wrong)))} got wrong values"] if wrong else []
    if len(records) != wanted:
        problems.append(f"{len(records)} of {wanted} ranks reported")
    slowest = min((r["bus_gbps"] for r in records), default=0.0)
    beside = f"{reference[0]:g} {reference[1]} ({reference[2]})" if reference else "no reference for this type"
    detail = (
        f"all-reduce and all-gather of known values on {len(records)} rank(s), {nodes} node(s); bus bandwidth "
        f"{slowest:.1f} Gbit/s (reference: {beside})" + (": " + "; ".join(problems) if problems else "")
    )
    figures = {"bus_gbps": slowest, "wrong_ranks": sorted(wrong), "ranks": len(records)}
    return Check(name, FAIL if problems else PASS, detail, figures)


def read_collectives(output: str) -> list[dict]:
    return [
        json.loads(line[len(COLLECTIVE_PREFIX) :]) for line in output.splitlines() if line.startswith(COLLECTIVE_PREFIX)
    ]


def check_ranks(kind: str, *, env=os.environ, payloads_dir: Path = PAYLOADS_DIR) -> list[Check]:
    """Every rank of one node on its own device, then the collectives among them: one probe run."""
    if kind != "neuron":
        return [Check("ranks", SKIP, NEEDS_NODE), Check("collectives", SKIP, NEEDS_NODE)]
    try:
        launcher = acceptance_launch.torchrun(env, payloads_dir)
        wanted = acceptance_launch.ranks_per_node(env, payloads_dir)
        out = run_launched([*launcher, "-m", "llm_pipeline.trn2_acceptance", "--rank-probe"])
    except (PipelineError, RuntimeError, OSError) as error:  # OSError: no torchrun here
        return [Check("ranks", FAIL, str(error)), Check("collectives", FAIL, str(error))]
    return [
        ranks_verdict(acceptance_launch.read_probes(out), wanted),
        collectives_verdict(read_collectives(out), wanted, nodes=1),
    ]


def ranks_verdict(probes: list[dict], wanted: int) -> Check:
    shared = acceptance_launch.duplicates(probes)
    places = sorted(f"{p['rank']}:{p['device']}[{p['cores'] or '-'}]" for p in probes)
    problems = shared + ([f"{len(probes)} of {wanted} ranks reported"] if len(probes) != wanted else [])
    detail = f"{len(probes)} rank(s): {', '.join(places)}" + (": " + "; ".join(problems) if problems else "")
    return Check("ranks", FAIL if problems else PASS, detail, {"probes": probes})


def run_launched(command: list[str], env=None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def lora_config_file(lora_config: Path, report: Path, *, nodes: int) -> Path:
    """The LoRA config at the level's shape: its steps, a loss every step, no checkpoints (the TOML editor)."""
    name = "lora-8b" if nodes == 1 else "two-node"
    keys = {
        ("parallel", "nodes"): nodes,
        ("train", "max_steps"): LORA_STEPS if nodes == 1 else TWO_NODE_STEPS,
        ("train", "logging_steps"): 1,
        ("train", "save_checkpoints"): False,
        ("train", "global_batch_size"): 0,
    }
    return write_derived(lora_config, report / f"{name}.toml", keys, run_dir=report / name)


def check_lora(kind: str, lora_config: Path, report: Path, *, env=os.environ) -> Check:
    if kind != "neuron":
        return Check("lora-8b", SKIP, NEEDS_NODE)
    path = lora_config_file(lora_config, report, nodes=1)
    try:
        out = run_launched(
            [*acceptance_launch.torchrun(env, PAYLOADS_DIR), "-m", "llm_pipeline.train", "--config", str(path)]
        )
    except (PipelineError, RuntimeError, OSError) as error:  # OSError: no torchrun here
        return Check("lora-8b", FAIL, str(error))
    return training_verdict("lora-8b", out, nodes=1)


def training_verdict(name: str, output: str, *, nodes: int) -> Check:
    """A level's training run from its output: the trainable count reported, a progress line a step whose
    losses follow the reference curve's fall (fleet_reference), samples/s and device memory beside the
    type's figures."""
    steps = LORA_STEPS if nodes == 1 else TWO_NODE_STEPS
    progress = ProgressLine.parse_all(output)
    trainable = TrainableLine.find(output)
    learned, curve, figures = fleet_reference.curve_verdict(
        [line.loss for line in progress], fleet_reference.reference_curve(steps)
    )
    references = fleet_reference.REFERENCES[TRN2_TYPE]
    memory = [part.split(" ", 2)[-1] for line in progress[-1:] for part in line.extra if part.startswith("peak mem")]
    figures.update(
        samples_per_second=progress[-1].samples_per_second if progress else None,
        device_memory=memory[0] if memory else None,
        trainable=trainable.trainable if trainable else None,
    )
    problems = ([] if learned else [curve]) + ([] if trainable else ["no trainable line"])
    rate = references["trn1_samples_per_second"]
    detail = (
        f"{steps} steps on {nodes} node(s); {curve}; trainable {figures['trainable'] or 'not reported'}; "
        f"{figures['samples_per_second']} samples/s (reference {rate[0]:.3f} {rate[1]}: {rate[2]}); peak device "
        f"memory {figures['device_memory'] or 'not reported'} (the node has {references['device_memory_gib'][0]:g} GiB)"
    )
    return Check(name, FAIL if problems else PASS, detail, figures)


VERDICT_FIGURES = {  # the check's figure and its bound, for the verdict table
    "device": ("matmul_difference", "bound"),
    "tiny-parity": ("max_relative_difference", None),
    "collectives": ("bus_gbps", None),
    "collectives-2-nodes": ("bus_gbps", None),
    "lora-8b": ("relative_fall", "bound_relative_fall"),
    "two-node": ("relative_fall", "bound_relative_fall"),
}
FIXED_BOUNDS = {"tiny-parity": f"<= {tiny_task.PARITY_RTOL} a step", "collectives": "exact values on every rank"}
FIXED_BOUNDS["collectives-2-nodes"] = FIXED_BOUNDS["collectives"]


def verdict_rows(checks: list[Check]) -> list[tuple[str, str, str, str]]:
    """(check, result, figure, bound) for each check: the table the report ends with."""
    rows = []
    for check in checks:
        figure_key, bound_key = VERDICT_FIGURES.get(check.name, (None, None))
        figure = check.figures.get(figure_key) if figure_key else None
        bound = check.figures.get(bound_key) if bound_key else FIXED_BOUNDS.get(check.name)
        show = f"{figure:.4g}" if isinstance(figure, float) else ("-" if figure is None else str(figure))
        rows.append((check.name, check.status, show, f"{bound:.4g}" if isinstance(bound, float) else bound or "-"))
    return rows


def write_report(checks: list[Check], report: Path, kind: str, name: str = "acceptance") -> None:
    report.mkdir(parents=True, exist_ok=True)
    summary = {"accelerator": kind, "checks": [asdict(check) for check in checks]}
    (report / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = ["# Trainium2 acceptance", "", f"accelerator: {kind}", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {c.detail.replace('|', '/')} |" for c in checks]
    lines += ["", "## Verdict", "", "| check | result | figure | bound |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in verdict_rows(checks)]
    (report / f"{name}.md").write_text("\n".join(lines) + "\n")


def print_checks(checks: list[Check]) -> None:
    for check in checks:
        print(f"{check.status:4}  {check.name:13}  {check.detail}", flush=True)
    print("\nverdict:", flush=True)
    for row in verdict_rows(checks):
        print(f"  {row[0]:20} {row[1]:4}  figure {row[2]:>12}  bound {row[3]}", flush=True)


def run(report: Path, *, tiny_config: Path | None, lora_config: Path, kind: str | None = None) -> list[Check]:
    """The one-node levels, in the image on the first node (``--on-node``)."""
    kind = accelerator() if kind is None else kind
    report.mkdir(parents=True, exist_ok=True)
    checks = [check_device(kind), *check_tiny(kind, report), check_resume(tiny_config, report), *check_ranks(kind)]
    checks.append(check_lora(kind, lora_config, report))
    write_report(checks, report, kind, NODE_REPORT)
    print_checks(checks)
    return checks


def run_from_host(report: Path, *, tiny_config: Path | None, lora_config: Path, env=os.environ) -> list[Check]:
    """Every level, each an srun into the image (acceptance_launch.level_commands), from the host in salloc."""
    levels = acceptance_launch.level_commands(
        env, PAYLOADS_DIR, report=report, tiny_config=tiny_config, lora_config=lora_config
    )
    report.mkdir(parents=True, exist_ok=True)
    lora_config_file(lora_config, report, nodes=2)
    outputs = {}
    for level in levels:
        print(f"+ {' '.join(level.argv)}", flush=True)
        try:
            outputs[level.name] = run_launched(level.argv, env={**env, **level.env})
        except (RuntimeError, OSError) as error:
            outputs[level.name] = error
    node = outputs["node"]
    checks = (
        [Check(**c) for c in json.loads((report / f"{NODE_REPORT}.json").read_text())["checks"]]
        if not isinstance(node, Exception) or (report / f"{NODE_REPORT}.json").is_file()
        else [Check("node", FAIL, str(node))]
    )
    wanted = 2 * acceptance_launch.ranks_per_node(env, PAYLOADS_DIR)
    pair = outputs["collectives-2-nodes"]
    efa = fleet_reference.REFERENCES[TRN2_TYPE]["efa_bus_gbps"]
    checks.append(
        Check("collectives-2-nodes", FAIL, str(pair))
        if isinstance(pair, Exception)
        else collectives_verdict(read_collectives(pair), wanted, nodes=2, reference=efa)
    )
    trained = outputs["two-node"]
    checks.append(
        Check("two-node", FAIL, str(trained))
        if isinstance(trained, Exception)
        else training_verdict("two-node", trained, nodes=2)
    )
    write_report(checks, report, "neuron")
    print_checks(checks)
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
    parser.add_argument(
        "--on-node", action="store_true", help="the one-node levels, in the image (what the host starts)"
    )
    parser.add_argument("--rank-probe", action="store_true", help=argparse.SUPPRESS)  # one rank of the rank check
    args = parser.parse_args(argv)
    if args.rank_probe:
        return rank_probe()
    if args.report_dir is None:
        parser.error("--report-dir is required")
    options = {"tiny_config": args.tiny_config, "lora_config": args.lora_config}
    try:
        checks = run(args.report_dir, **options) if args.on_node else run_from_host(args.report_dir, **options)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    code, line = outcome(checks, offline=args.offline)
    print(f"{line}; report in {args.report_dir}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
