"""GRPO's rollout server: vLLM's OpenAI-compatible server for the base model with runtime LoRA loading, which the
trainer samples completions from and loads the policy's adapter into (training/torch/grpo.py). The train step
starts it in the background on the allocation's last node (grpo.rollout node) or beside the trainer (colocated);
it writes <run>/rollout/endpoint once it answers and serves until the step ends it.

    python -m llm_pipeline.rollout_server --config run.toml      (in the vLLM site, as the serve step)
    python -m llm_pipeline.rollout_server --placement run.toml   (none, colocated or node; any Python)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llm_pipeline import cli, config
from llm_pipeline.config import RunConfig
from llm_pipeline.training.rollouts import rollout_dir


def placement(cfg: RunConfig) -> str:
    """none (not a GRPO run), colocated or node: where the train step starts the rollout server."""
    return cfg.grpo.placement(cfg.parallel.nodes) if cfg.train.objective == "grpo" else "none"


def serve_rollouts(cfg: RunConfig) -> None:
    from llm_pipeline.serve import rank_slot, serve_until_stopped  # the vLLM site's side only (not --placement)

    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter, which the trainer calls
    extra = ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(rank_slot(cfg.lora.r, "lora.r"))]
    serve_until_stopped(
        cfg,
        Path(cfg.paths.model_dir),
        rollout_dir(cfg),
        served_name="base",
        extra=extra,
        max_model_len=cfg.data.max_length + cfg.grpo.max_completion_length,
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--placement"] and len(argv) == 2:
        print(placement(config.load(argv[1])))
        return 0
    return cli.run_config_only_step("rollout-server", __doc__.split("\n\n")[0], serve_rollouts, argv)


if __name__ == "__main__":
    raise SystemExit(main())
