"""One rank of tests/payloads/test_load_memory.py (under torchrun, gloo): the engine loads the run
config's model the way its parallel strategy says (once a node, or on every rank) and writes how much
this process's peak resident memory grew while it did, and the model's size.

    torchrun --nproc-per-node=N load_memory_probe.py --config RUN.toml --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import resource
from pathlib import Path

import torch.distributed as dist

from llm_pipeline import config
from llm_pipeline.training.torch import backend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cfg = config.load(args.config)
    world = dist.get_world_size()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    model = backend.load_for_rank(cfg, world)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    record = {"rank": dist.get_rank(), "peak_growth": after - before, "model": total}
    (args.out / f"rank-{os.environ['RANK']}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
