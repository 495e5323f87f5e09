"""GRPO's rollout server: vLLM's OpenAI-compatible server for the base model with runtime LoRA loading, which the
trainer samples completions from and loads the policy's adapter into (training/rollouts.py). The train step
starts it in the background on the allocation's last node (grpo.rollout node) or beside the trainer (colocated);
it writes <run>/rollout/endpoint once it answers and serves until the step ends it.

    python -m llm_pipeline.rollout_server --config run.toml      (in the vLLM site, as the serve step)
    python -m llm_pipeline.rollout_server --placement run.toml   (none, colocated or node; any Python)
    python -m llm_pipeline.rollout_server --wait run.toml PID     (until it answers; PID: the server's launcher)
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from llm_pipeline import cli, config
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs.partitions import CUDA
from llm_pipeline.training.rollouts import ENDPOINT_WAIT_S, rollout_dir, wait_for_endpoint


def placement(cfg: RunConfig) -> str:
    """none (not a GRPO run), colocated or node: where the train step starts the rollout server."""
    return cfg.grpo.placement(cfg.parallel.nodes) if cfg.train.objective == "grpo" else "none"


def server_arguments(cfg: RunConfig, *, gpu: bool) -> list[str]:
    """vLLM's arguments beyond the served model: runtime LoRA of the policy's rank and, on a GPU, the memory share
    of the placement (colocated: the trainer holds the rest of the GPU)."""
    from llm_pipeline.serve import rank_slot

    extra = ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(rank_slot(cfg.lora.r, "lora.r"))]
    if gpu:
        extra += ["--gpu-memory-utilization", str(cfg.grpo.server_memory_share(cfg.parallel.nodes))]
    return extra


def serve_rollouts(cfg: RunConfig) -> None:
    from llm_pipeline.serve import serve_until_stopped  # the vLLM site's side only (not --placement)

    print(f"rollout server on {os.environ.get('SLURMD_NODENAME') or socket.gethostname()}", flush=True)
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter, which the trainer calls
    extra = server_arguments(cfg, gpu=os.environ.get("HPL_ACCELERATOR") == CUDA)
    serve_until_stopped(
        cfg,
        Path(cfg.paths.model_dir),
        rollout_dir(cfg),
        served_name="base",
        extra=extra,
        max_model_len=cfg.data.max_length + cfg.grpo.max_completion_length,
    )


def launcher_alive(pid: int) -> bool:
    """Whether the server's launcher (train.sbatch's background srun) still runs: not gone, not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.is_file() or stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--placement"] and len(argv) == 2:
        print(placement(config.load(argv[1])))
        return 0
    if argv[:1] == ["--wait"] and len(argv) == 3:  # train.sbatch, before the trainer starts (host Python)
        try:
            folder, launcher = rollout_dir(config.load(argv[1])), int(argv[2])
            url = wait_for_endpoint(folder, ENDPOINT_WAIT_S, lambda: launcher_alive(launcher))
            print(f"rollout server at {url}")
        except PipelineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    return cli.run_config_only_step("rollout-server", __doc__.split("\n\n")[0], serve_rollouts, argv)


if __name__ == "__main__":
    raise SystemExit(main())
