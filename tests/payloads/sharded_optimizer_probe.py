"""Two gloo ranks (torchrun) save an FSDP2 model's Adam state as accelerate does, then each loads it
back with llm_pipeline's load_sharded_optimizer from a folder that holds only what its host would
hold within a training job (the .metadata and its own file). Prints JSON on rank 0.

    torchrun --standalone --nproc_per_node=2 sharded_optimizer_probe.py FOLDER
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from llm_pipeline.training.torch import parallel


def adam(model, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr)


def state(optimizer, model) -> dict:
    """Every entry as plain values: DTensors as this rank's local shard."""
    full = get_optimizer_state_dict(model, optimizer)
    local = {
        f"{name}.{key}": (value.to_local() if hasattr(value, "to_local") else value).tolist()
        for name, entries in full["state"].items()
        for key, value in entries.items()
    }
    return {"state": local, "lr": [group["lr"] for group in full["param_groups"]]}


def main(root: Path) -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = adam(model, lr=1e-3)
    for _ in range(2):
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    for group in optimizer.param_groups:
        group["lr"] = 0.123  # where a scheduler left it
    saved = root / "saved" / parallel.SHARDED_OPTIMIZER_DIR
    # as accelerate 1.8.1 / 1.14.0 save_fsdp_optimizer writes it
    dcp.save(
        {"optimizer": get_optimizer_state_dict(model, optimizer)},
        storage_writer=dcp.FileSystemWriter(saved),
        planner=DefaultSavePlanner(),
    )
    dist.barrier()
    host = root / f"host-{rank}"
    (host / saved.name).mkdir(parents=True)
    for name in (".metadata", f"__{rank}_0.distcp"):
        shutil.copy2(saved / name, host / saved.name / name)
    fresh = adam(model, lr=1e-3)
    planner = parallel.host_files_planner(host / saved.name)
    probe = SimpleNamespace(model=model, optimizer=fresh)
    parallel.load_sharded_optimizer(probe, host)
    # which replicated entries this rank read from another rank's file (they came over the process group)
    planner.set_up_planner(
        {"optimizer": get_optimizer_state_dict(model, fresh)}, dcp.FileSystemReader(saved).read_metadata()
    )
    planner.create_local_plan()
    foreign = sum(1 for writer in planner.writers.values() if writer != rank)
    results = [None, None]
    dist.all_gather_object(results, {"equal": state(fresh, model) == state(optimizer, model), "foreign": foreign})
    if rank == 0:
        print(json.dumps({"ranks": results, "lr": state(fresh, model)["lr"]}))
    dist.barrier()
    return 0


if __name__ == "__main__":
    from llm_pipeline.cli import exit_step  # FSDP2 keeps gloo's workers alive: see its docstring

    exit_step(main(Path(sys.argv[1])))
