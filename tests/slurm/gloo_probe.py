"""A real multi-node collective: each torchrun worker joins the gloo group, all-reduces its rank
and writes what it saw (rank, world, node, settings from env.sh) to probe-<rank>.json in $HPL_PROBE_DIR
(default $HPL_RUN_DIR).
Launched by probe.sbatch through env.sh's hpl_torchrun, exactly as the train step is launched."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.parse_args()
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
seen = {
    "rank": dist.get_rank(),
    "world": dist.get_world_size(),
    "sum": total.item(),
    "node": os.environ.get("SLURMD_NODENAME"),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "env": {
        name: os.environ.get(name)
        for name in (
            "FI_PROVIDER",
            "FI_EFA_USE_DEVICE_RDMA",
            "FI_EFA_FORK_SAFE",
            "HF_HUB_OFFLINE",
            "MALLOC_ARENA_MAX",
            "NEURON_CC_FLAGS",
            "NEURON_RT_STOCHASTIC_ROUNDING_EN",
        )
    },
}
folder = Path(os.environ.get("HPL_PROBE_DIR") or os.environ["HPL_RUN_DIR"])
folder.mkdir(parents=True, exist_ok=True)
(folder / f"probe-{dist.get_rank()}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
