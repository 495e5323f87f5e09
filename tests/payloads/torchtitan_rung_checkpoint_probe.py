"""A ladder rung's final checkpoint, saved by torchtitan 0.2.2's own CheckpointManager under FSDP2 on gloo.

    torchrun --nproc_per_node=2 torchtitan_rung_checkpoint_probe.py JOB.toml STEPS

Run with torchtitan and torchao importable (.venv/torchtitan-site). The rung's job file (as the
ladder wrote it) is parsed by torchtitan's ConfigManager; then the trainer's own parts, in the
trainer's order: the llama3 train spec's model and init_weights, the job's model converters
(float8 linears for the fp8 rungs), FSDP2 (torchtitan's apply_fsdp), the optimizer and LR scheduler
with the converters' post-optimizer hook (the precomputed float8 scales), and the CheckpointManager's
last-step save (model only, export_dtype) into <dump_folder>/<checkpoint.folder>/step-STEPS.

Two CPU-only settings, because float8 matmuls need a GPU of compute capability 8.9: the float8
config's `emulate` is set (torchao computes the same casts and scales in higher precision), and
compile is off (torchtitan refuses emulation with a compiled model). The saved weights are what a
GPU run saves: the float8 all-gather wraps them in torchao's WeightWithDynamicFloat8CastTensor.
Rank 0 prints one JSON line: the step folder and the weight classes it saw.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

GLOBAL_BATCH = 4


def main(job_file: str, steps: int) -> int:
    import torchtitan.protocols.train_spec as train_spec
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    from torchtitan.protocols.model_converter import build_model_converters

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = ConfigManager().parse_args(["--job.config_file", job_file])
    job.quantize.linear.float8.emulate = True  # CPU: see the docstring
    job.compile.enable = False
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=world)

    spec = train_spec.get_train_spec(job.model.name)
    args = spec.model_args[job.model.flavor]
    seq = min(job.training.seq_len, 64)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    converters = build_model_converters(job, parallel_dims)
    converters.convert(model)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    for module in model.modules():  # gloo has no PreMulSum (see torchtitan_fsdp_probe.py)
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    optimizers = spec.build_optimizers_fn([model], job.optimizer, parallel_dims)
    schedulers = spec.build_lr_schedulers_fn(optimizers, job.lr_scheduler, steps)
    optimizers.register_step_post_hook(lambda *a, **k: converters.post_optimizer_hook([model]))

    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        batch = torch.randint(0, args.vocab_size, (GLOBAL_BATCH, seq + 1), generator=data).chunk(world)[rank]
        loss = cross_entropy_loss(model(batch[:, :-1]), batch[:, 1:]) / (GLOBAL_BATCH * seq)
        optimizers.zero_grad()
        loss.backward()
        optimizers.step()
        schedulers.step()

    checkpointer = CheckpointManager(
        dataloader=None,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={},
        checkpoint_config=job.checkpoint,
        sd_adapter=spec.state_dict_adapter(args, job.model.hf_assets_path) if spec.state_dict_adapter else None,
        base_folder=job.job.dump_folder,
    )
    checkpointer.save(curr_step=steps, last_step=True)
    classes = sorted({type(p.to_local()).__name__ for p in model.parameters()})
    if rank == 0:
        print(json.dumps({"saved": checkpointer._create_checkpoint_id(steps), "weight_classes": classes}))
    checkpointer.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
