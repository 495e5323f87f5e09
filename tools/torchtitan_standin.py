"""A CPU stand-in for `python -m torchtitan.train` in ladder rehearsals (torchtitan's trainer needs CUDA).

    HPL_TORCHTITAN_MODULE=tools.torchtitan_standin  (ladder-rung.sbatch runs it under torchrun)

It runs torchtitan 0.2.2's own parts in the trainer's order, on gloo: the job file through
torchtitan's ConfigManager, its custom import, the train spec's model of the job's flavor and
init_weights, the job's model converters (the float8 linears of the fp8 rungs), FSDP2 (torchtitan's
apply_fsdp), the train spec's optimizer and LR scheduler with the converters' post-optimizer hook,
and torchtitan's CheckpointManager, which first loads the newest step-N checkpoint of the job's folder
(model, optimizer, LR scheduler and the step, as the Trainer resumes), then saves every
checkpoint.interval steps and the model-only final step the export reads. Two CPU-only settings:
float8 runs in torchao's emulation (float8 matmuls need a GPU of compute capability 8.9) and compile
is off (torchtitan refuses emulation with a compiled model). Tokens are a learnable random stream
(each token the previous plus one), not the dataset.

At step 1 and every metrics.log_freq steps each rank prints one line in torchtitan's metric format
(torchtitan/components/metrics.py, MetricsProcessor.log, colors off) through torchtitan's log
format ("[titan] <time> - root - INFO - "). Every figure is measured here: loss is the global mean,
memory is this process's peak resident set (of the host's RAM), tps tokens per second per process,
tflops 6 x parameters x tps, mfu against the H100 bf16 peak torchtitan itself falls back to for a
device it does not know. The figures describe a CPU, never a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import platform
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from llm_pipeline.run_files import TitanMetricLine

H100_BF16_PEAK_FLOPS = 989e12  # torchtitan.tools.utils.get_peak_flops' fallback
MAX_SEQ = 64  # CPU: sequences are cut to this length


def metric_line(
    step: int, loss: float, grad_norm: float, mem_gib: float, mem_pct: float, tps: float, tflops: float, mfu: float
) -> str:
    """One metric line, in torchtitan 0.2.2's format with colors off."""
    return TitanMetricLine(step, loss, grad_norm, mem_gib, mem_pct, round(tps), tflops, mfu).format()


def build_logger() -> logging.Logger:
    logger = logging.getLogger()
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    logger.addHandler(handler)
    return logger


def peak_memory() -> tuple[float, float]:
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss: KiB on Linux
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return rss_gib, 100 * rss_gib / total_gib


class TrainState:
    """The trainer's own checkpointed state, as torchtitan's Trainer keeps it (train.py: step, tokens seen)."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self) -> dict:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step, self.ntokens_seen = state_dict["step"], state_dict["ntokens_seen"]


def build(job, world: int, train_state: TrainState):
    """torchtitan's model, converters, FSDP2, optimizer, scheduler and checkpointer for `job`."""
    import torchtitan.protocols.train_spec as train_spec
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp
    from torchtitan.protocols.model_converter import build_model_converters

    job.quantize.linear.float8.emulate = True  # CPU: see the module docstring
    job.compile.enable = False
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=world)
    spec = train_spec.get_train_spec(job.model.name)
    args = spec.model_args[job.model.flavor]
    torch.manual_seed(0)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    converters = build_model_converters(job, parallel_dims)
    converters.convert(model)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    # apply_fsdp sets FSDP's gradient divide factor to 1, on NCCL a PreMulSum by 1; gloo has no
    # PreMulSum, so FSDP is asked for that same plain sum directly.
    for module in model.modules():
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    optimizers = spec.build_optimizers_fn([model], job.optimizer, parallel_dims)
    schedulers = spec.build_lr_schedulers_fn(optimizers, job.lr_scheduler, job.training.steps)
    optimizers.register_step_post_hook(lambda *a, **k: converters.post_optimizer_hook([model]))
    adapter = spec.state_dict_adapter(args, job.model.hf_assets_path) if spec.state_dict_adapter else None
    checkpointer = CheckpointManager(
        dataloader=None,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": train_state},
        checkpoint_config=job.checkpoint,
        sd_adapter=adapter,
        base_folder=job.job.dump_folder,
    )
    return model, args, optimizers, schedulers, checkpointer


def main(argv: list[str] | None = None) -> int:
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import utils as dist_utils

    parser = argparse.ArgumentParser(prog="python -m tools.torchtitan_standin")
    parser.add_argument("--job.config_file", dest="config_file", required=True)
    job_file = parser.parse_args(argv).config_file
    job = ConfigManager().parse_args(["--job.config_file", job_file])
    if job.experimental.custom_import:  # as torchtitan's Trainer does
        importlib.import_module(job.experimental.custom_import)
    steps, log_freq = job.training.steps, job.metrics.log_freq
    batch, seq = job.training.local_batch_size, min(job.training.seq_len, MAX_SEQ)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = build_logger()
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    logger.info(f"CPU capacity: {platform.machine() or 'cpu'} host with {total_gib:.2f}GiB memory")
    logger.info(f"stand-in for torchtitan.train: {job_file}, {steps} steps, rank {rank} of {world}")
    state = TrainState()
    model, args, optimizers, schedulers, checkpointer = build(job, world, state)
    checkpointer.load(step=job.checkpoint.load_step)  # as the Trainer does: the newest step-N, if any
    logger.info(f"Training starts at step {state.step + 1}")
    params = sum(p.numel() for p in model.parameters())
    logger.info(f"{job.model.name} {job.model.flavor}: {params:,} parameters, converters {job.model.converters}")

    data = torch.Generator().manual_seed(1234 + rank)
    starts = torch.randint(0, args.vocab_size, (steps, batch, 1), generator=data)
    tokens_since, last = 0, time.perf_counter()
    for step in range(state.step + 1, steps + 1):
        state.step = step
        sequence = (starts[step - 1] + torch.arange(seq + 1)) % args.vocab_size
        labels = sequence[:, 1:]
        global_tokens = torch.tensor(float(labels.numel()))
        dist.all_reduce(global_tokens)
        loss = cross_entropy_loss(model(sequence[:, :-1]), labels) / global_tokens  # the trainer's normalization
        optimizers.zero_grad()
        loss.backward()
        grad_norm = dist_utils.clip_grad_norm_(list(model.parameters()), max_norm=job.training.max_norm)
        optimizers.step()
        schedulers.step()
        tokens_since += batch * seq
        state.ntokens_seen += batch * seq
        if step == 1 or step % log_freq == 0:
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)
            norm = grad_norm.full_tensor().item() if hasattr(grad_norm, "full_tensor") else grad_norm.item()
            tps = tokens_since / (time.perf_counter() - last)
            mem_gib, mem_pct = peak_memory()
            tflops = 6 * params * tps / 1e12
            mfu = 100 * 6 * params * tps / H100_BF16_PEAK_FLOPS
            logger.info(metric_line(step, global_loss.item(), norm, mem_gib, mem_pct, tps, tflops, mfu))
            tokens_since, last = 0, time.perf_counter()
        checkpointer.save(curr_step=step, last_step=step == steps)
    logger.info("Training completed")
    checkpointer.close()
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from llm_pipeline.cli import exit_step  # FSDP2 keeps gloo's workers alive: see its docstring

    exit_step(main())
