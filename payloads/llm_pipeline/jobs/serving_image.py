"""Which runs start a vLLM server on the nodes, and whether the cluster can (stdlib only, Python 3.10).

Two steps of a chain start one: the benchmark step (lm-eval scores through it) and a GRPO run's train step (its
rollout server); `hpctl serve` starts one as a job of its own. On a host runtime they run from the nodes' vLLM
site; under Pyxis, in the partition's serving image (payloads/Dockerfile.serve), whose URI the deploy writes
into the partition's facts (HPL_SERVING_IMAGE_URI). One rule for both sides: submit refuses a run the
partition cannot serve, and the prepare step imports the serving image only for a run that needs it:
``python3 -m llm_pipeline.jobs.serving_image --needed RUN.toml`` (exit 0: needed, 1: not, 2: the config is bad).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from llm_pipeline.config import RunConfig, load
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs.partitions import NEURON

SERVING_IMAGE_ENV = "HPL_SERVING_IMAGE_URI"
# How long a vLLM server may take to answer (llm_pipeline.vllm_server; the serve job's wait adds it): an 8B model's
# load and warm-up, the tiny model's seconds; on Neuron vLLM compiles the model for its shapes when it starts (NxD
# Inference), far longer than a GPU's load (not measured here: no Trainium).
SERVER_START_S = 900
NEURON_SERVER_START_S = 3600


def server_start_limit_s(accelerator: str) -> int:
    """How long a server may take to answer on ``accelerator`` (HPL_ACCELERATOR)."""
    return NEURON_SERVER_START_S if accelerator == NEURON else SERVER_START_S


class ServingImageError(PipelineError):
    """The run needs a vLLM server the chosen partition cannot start."""


def vllm_uses(run: RunConfig) -> list[str]:
    """The run config keys that make a chain start a vLLM server, as a user would name them."""
    wanted = (
        ("benchmark.tasks", bool(run.benchmark.runs())),
        ("train.objective = 'grpo'", run.train.objective == "grpo"),
    )
    return [key for key, on in wanted if on]


def check_serving(uses: list[str], env: Mapping[str, str], *, grpo: bool = False) -> None:
    """Under Pyxis: a partition's deploy facts name a serving image for ``uses`` (what starts a vLLM server, as
    :func:`vllm_uses` names it), and a GRPO run does not ask it of Trainium. Refused at submit in one line, not in
    the middle of the chain."""
    if env.get("HPL_RUNTIME") != "pyxis" or not uses:
        return
    partition = f"partition {env['HPL_PARTITION']}" if env.get("HPL_PARTITION") else "the default partition"
    if not env.get(SERVING_IMAGE_ENV):
        raise ServingImageError(
            f"{' and '.join(uses)} start(s) a vLLM server on the nodes, and {partition} has no serving image in "
            "this cluster's deploy facts (a deploy before serving images): deploy again (make deploy) to build it"
        )
    if grpo and env.get("HPL_ACCELERATOR") == NEURON:
        raise ServingImageError(
            f"train.objective = 'grpo' on {partition} (Trainium): the rollout server loads each new policy adapter "
            "while it runs (vLLM's /v1/load_lora_adapter), which this project builds and rehearses with vLLM's CUDA "
            "and CPU builds only: set parallel.partition to a GPU partition"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Whether a run starts a vLLM server on the nodes.")
    parser.add_argument("--needed", metavar="RUN_TOML", required=True, help="exit 0 when the run needs one, else 1")
    args = parser.parse_args(argv)
    try:
        return 0 if vllm_uses(load(args.needed)) else 1
    except PipelineError as exc:  # the prepare step's own check then names the same fault
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
