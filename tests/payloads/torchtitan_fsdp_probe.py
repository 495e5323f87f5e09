"""torchtitan 0.2.2's llama3 debug model trained a few steps under FSDP2 on gloo; prints JSON on rank 0.

    torchrun --nproc_per_node=N torchtitan_fsdp_probe.py STEPS

Run with torchtitan importable (.venv/torchtitan-site). torchtitan's Trainer calls CUDA
unconditionally (it picks its device, memory monitor and peak FLOPS from CUDA), so it cannot run
here; this probe composes the trainer's own parts on CPU instead: the llama3 train spec's
"debugmodel" arguments and model class, `init_weights`, torchtitan's `apply_fsdp` (FSDP2
fully_shard per block, gradient division off), its cross-entropy (a token sum) divided by the
global token count as Trainer.forward_backward_step does, its `clip_grad_norm_` and AdamW. One
gloo-only setting: FSDP reduces gradients with a plain sum (see below), the arithmetic NCCL does.
The global batch is the same for every world size; each rank takes its share.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

SEQ, GLOBAL_BATCH, VOCAB = 32, 4, 2048


def main(steps: int) -> int:
    import torchtitan.protocols.train_spec as train_spec
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = train_spec.get_train_spec("llama3")
    args = spec.model_args["debugmodel"]
    args.max_seq_len = SEQ
    torch.manual_seed(0)
    model = spec.model_cls(args)
    with torch.no_grad():  # as the trainer initializes its weights
        model.init_weights(buffer_device=torch.device("cpu"))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    # apply_fsdp turns FSDP's gradient division off (divide factor 1): on NCCL a PreMulSum by 1, a
    # plain sum. Gloo has no PreMulSum, so FSDP is asked for that same sum directly.
    for module in model.modules():
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    data = torch.Generator().manual_seed(1)
    losses, grad_norms = [], []
    for _ in range(steps):
        batch = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=data)
        share = batch.chunk(world)[rank]
        inputs, labels = share[:, :-1], share[:, 1:]
        local_tokens = torch.tensor(float(labels.numel()))
        global_tokens = local_tokens.clone()
        dist.all_reduce(global_tokens)
        loss = cross_entropy_loss(model(inputs), labels) / global_tokens
        optimizer.zero_grad()
        loss.backward()
        grad_norm = dist_utils.clip_grad_norm_(list(model.parameters()), max_norm=1.0)
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item())
        grad_norms.append(grad_norm.full_tensor().item() if hasattr(grad_norm, "full_tensor") else grad_norm.item())
    weights = {name: p.full_tensor() for name, p in model.named_parameters()}
    if rank == 0:
        checksum = {name: [w.double().sum().item(), w.double().abs().sum().item()] for name, w in weights.items()}
        sharded = sum(1 for p in model.parameters() if p.to_local().numel() < p.numel())
        print(
            json.dumps(
                {"world": world, "losses": losses, "grad_norms": grad_norms, "weights": checksum, "sharded": sharded}
            )
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from llm_pipeline.cli import exit_step  # FSDP2 keeps gloo's workers alive: see its docstring

    exit_step(main(int(sys.argv[1])))
