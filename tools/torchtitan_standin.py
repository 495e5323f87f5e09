"""A CPU stand-in for `python -m torchtitan.train` in ladder rehearsals (torchtitan's trainer needs CUDA).

    HPL_TORCHTITAN_MODULE=tools.torchtitan_standin  (ladder-rung.sbatch runs it under torchrun)

Reads the rung's job file (training.steps, local_batch_size, seq_len, max_norm, metrics.log_freq,
optimizer.lr), trains a tiny causal language model with DDP over gloo on random tokens, and prints
at step 1 and every log_freq steps one line per rank in torchtitan 0.2.2's metric format
(torchtitan/components/metrics.py, MetricsProcessor.log, colors off) through torchtitan's log
format ("[titan] <time> - root - INFO - "). Every figure is measured here: loss is the global mean,
memory is this process's peak resident set (of the host's RAM), tps tokens per second per process,
tflops 6 x parameters x tps, mfu against the H100 bf16 peak torchtitan itself falls back to for a
device it does not know. Nothing about compile or float8 is emulated: every rung trains the same.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import sys
import time

import tomllib
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

H100_BF16_PEAK_FLOPS = 989e12  # torchtitan.tools.utils.get_peak_flops' fallback
VOCAB, DIM, MAX_SEQ = 512, 64, 64


def metric_line(
    step: int, loss: float, grad_norm: float, mem_gib: float, mem_pct: float, tps: float, tflops: float, mfu: float
) -> str:
    """One metric line, in torchtitan 0.2.2's format with colors off."""
    return (
        f"step: {step:2}  loss: {loss:8.5f}  grad_norm: {grad_norm:7.4f}  "
        f"memory: {mem_gib:5.2f}GiB({mem_pct:.2f}%)  tps: {round(tps):,}  tflops: {tflops:,.2f}  mfu: {mfu:.2f}%"
    )


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.torchtitan_standin")
    parser.add_argument("--job.config_file", dest="config_file", required=True)
    args = parser.parse_args(argv)
    with open(args.config_file, "rb") as f:
        job = tomllib.load(f)
    training, metrics = job.get("training", {}), job.get("metrics", {})
    steps, log_freq = int(training.get("steps", 10)), int(metrics.get("log_freq", 10))
    batch, seq = int(training.get("local_batch_size", 8)), min(int(training.get("seq_len", 2048)), MAX_SEQ)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = build_logger()
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    logger.info(f"CPU capacity: {platform.machine() or 'cpu'} host with {total_gib:.2f}GiB memory")
    logger.info(f"stand-in for torchtitan.train: {args.config_file}, {steps} steps, rank {rank} of {world}")

    torch.manual_seed(0)
    core = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, DIM), torch.nn.GELU())
    model = DistributedDataParallel(torch.nn.Sequential(core, torch.nn.Linear(DIM, VOCAB)))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(job.get("optimizer", {}).get("lr", 8e-4)))
    data = torch.Generator().manual_seed(1234 + rank)
    # A learnable stream: each token is the previous one plus one, from a random start.
    starts = torch.randint(0, VOCAB, (steps, batch, 1), generator=data)
    tokens_since, last = 0, time.perf_counter()
    for step in range(1, steps + 1):
        sequence = (starts[step - 1] + torch.arange(seq + 1)) % VOCAB
        logits = model(sequence[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), sequence[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(training.get("max_norm", 1.0)))
        optimizer.step()
        tokens_since += batch * seq
        if step == 1 or step % log_freq == 0:
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)
            tps = tokens_since / (time.perf_counter() - last)
            mem_gib, mem_pct = peak_memory()
            tflops = 6 * params * tps / 1e12
            mfu = 100 * 6 * params * tps / H100_BF16_PEAK_FLOPS
            logger.info(
                metric_line(step, global_loss.item() / world, grad_norm.item(), mem_gib, mem_pct, tps, tflops, mfu)
            )
            tokens_since, last = 0, time.perf_counter()
    logger.info("Training completed")
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
