"""Serve step: the run's tuned model behind vLLM's OpenAI-compatible server, until the job is cancelled or its
time limit ends (llm_pipeline.jobs.serve_job submits it; `hpctl serve RUN`).

    python -m llm_pipeline.serve --config run.toml

The run's LoRA adapter (paths.adapter_dir) is served over the base model without merging (vLLM's --enable-lora);
a run without one serves its merged model. Either way the tuned model answers to the name TUNED_NAME. Once the
server answers, the step writes <run>/serve/endpoint (this node's address and the port) and waits.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

from llm_pipeline import cli
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.serve_job import ENDPOINT_FILE, serve_dir
from llm_pipeline.run_files import SERVER_LOG
from llm_pipeline.vllm_server import check_cpu_head_size, free_port, on_cpu, server_command, started
from llm_pipeline.weights import model_files

TUNED_NAME = "tuned"  # what a request names as its model
BASE_NAME = "base"  # with an adapter: the base model, also served
ADAPTER_CONFIG = "adapter_config.json"
# vLLM 0.32's --max-lora-rank choices (vllm/config/lora.py MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def rank_slot(rank: int, what: str) -> int:
    """The smallest --max-lora-rank vLLM takes that holds a LoRA rank."""
    for choice in LORA_RANKS:
        if choice >= rank:
            return choice
    raise StepError(f"{what}: LoRA rank {rank} is above vLLM's largest ({LORA_RANKS[-1]}): use a smaller lora.r")


def lora_rank(adapter_dir: Path) -> int:
    """The smallest --max-lora-rank vLLM takes that holds the adapter's rank."""
    return rank_slot(int(json.loads((adapter_dir / ADAPTER_CONFIG).read_text())["r"]), str(adapter_dir))


def lora_arguments(adapter: Path) -> list[str]:
    """vLLM's arguments serving ``adapter`` as TUNED_NAME beside the base model (one server for both)."""
    return ["--enable-lora", "--lora-modules", f"{TUNED_NAME}={adapter}", "--max-lora-rank", str(lora_rank(adapter))]


def what_to_serve(cfg: RunConfig) -> tuple[Path, str, list[str]]:
    """(model folder, the name it answers to, further server arguments): the adapter over the base, else merged."""
    adapter = Path(cfg.paths.adapter_dir)
    if (adapter / ADAPTER_CONFIG).is_file():
        return Path(cfg.paths.model_dir), BASE_NAME, lora_arguments(adapter)
    merged = Path(cfg.paths.merged_dir)
    if (merged / model_files.CONFIG_NAME).is_file():
        return merged, TUNED_NAME, []
    raise StepError(f"run {cfg.paths.output_dir} has neither an adapter ({adapter}) nor a merged model ({merged})")


def serve(cfg: RunConfig) -> None:
    model_dir, name, extra = what_to_serve(cfg)
    serve_until_stopped(cfg, model_dir, serve_dir(Path(cfg.paths.output_dir)), served_name=name, extra=extra)


def serve_until_stopped(
    cfg: RunConfig, model_dir: Path, folder: Path, *, served_name: str, extra: list[str], **command_keys
) -> None:
    """vLLM's server for ``model_dir`` on this node, its address in ``folder``/endpoint (host:port) while it
    answers, until SIGTERM (scancel, the time limit, the job's end) or the server's exit."""
    if on_cpu():
        check_cpu_head_size(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    endpoint = folder / ENDPOINT_FILE
    endpoint.unlink(missing_ok=True)  # a former server's address: no client may take it for this one's
    # scancel and the time limit send SIGTERM: leave through the server's stop and the endpoint's removal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = free_port("0.0.0.0")
    command = server_command(model_dir, port, cfg, host="0.0.0.0", served_name=served_name, extra=extra, **command_keys)
    log = folder / SERVER_LOG
    try:
        with started(command, url=f"http://127.0.0.1:{port}", what=str(model_dir), log=log) as server:
            host = socket.gethostbyname(socket.gethostname())  # what the controller reaches this node by
            written = endpoint.with_suffix(".tmp")
            written.write_text(f"{host}:{port}\n")
            written.rename(endpoint)
            print(f"serving {model_dir} ({' '.join(extra) or 'merged'}) at {host}:{port}", flush=True)
            server.wait()
            raise StepError(f"the vLLM server exited with {server.returncode}: see {log}")
    finally:
        endpoint.unlink(missing_ok=True)


def main(argv=None) -> int:
    return cli.run_config_only_step("serve", __doc__.split("\n\n")[0], serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
