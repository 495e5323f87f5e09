"""A real collective across SageMaker-style hosts: each torchrun worker joins gloo, all-reduces its
rank and writes what it saw to $PROBE_DIR/rank-<rank>.json."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
seen = {
    "rank": dist.get_rank(),
    "world": dist.get_world_size(),
    "sum": total.item(),
    "node": int(os.environ["GROUP_RANK"]),
}
Path(os.environ["PROBE_DIR"], f"rank-{dist.get_rank()}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
