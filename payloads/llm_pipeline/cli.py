"""What every step's command line shares: `--config`, clear `error: ...` lines, exit codes.

Bad input (any PipelineError: a ConfigError, a StepError...) prints one line on stderr and exits 2,
the same code argparse uses for bad arguments, so the Slurm scripts and the user see a reason rather
than a traceback.
The train step ends through `exit_step`, which keeps a finished gloo rank from aborting at exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from llm_pipeline import __version__
from llm_pipeline.config import RunConfig, load
from llm_pipeline.errors import PipelineError

BAD_INPUT = 2
GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads
# bitsandbytes (peft imports it on every adapter step) fetches a 4-bit CPU matmul kernel from the Hub when the CPU
# has AVX512-BF16, and warns when it cannot (offline, no `kernels` package): the kernel only speeds up 4-bit
# matmuls on a CPU, and its fallback computes the same, so the warning is noise in every step log.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def parser(step: str, description: str) -> argparse.ArgumentParser:
    """An argument parser for `python -m llm_pipeline.<step>` with the shared --config option."""
    result = argparse.ArgumentParser(prog=f"python -m llm_pipeline.{step}", description=description)
    result.add_argument("--config", required=True, metavar="RUN.toml", help="the run config (see payloads/configs/)")
    add_version(result)
    return result


def add_version(command: argparse.ArgumentParser) -> None:
    """`--version`: the project version the payload code on this host belongs to."""
    command.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def run_config_only_step(
    step: str, description: str, body: Callable[[RunConfig], object], argv: Sequence[str] | None = None
) -> int:
    """`run_step` for a step whose only argument is --config."""
    return run_step(lambda: parser(step, description), lambda cfg, args: body(cfg), argv)


def run_step(
    build_parser: Callable[[], argparse.ArgumentParser],
    body: Callable[[RunConfig, argparse.Namespace], None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse arguments, load the run config, run the step; bad input becomes `error: ...` and exit 2."""
    args = build_parser().parse_args(argv)
    try:
        body(load(args.config), args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return BAD_INPUT
    return 0


def gloo_workers_alive() -> bool:
    """Whether a gloo process group's worker threads run in this process (Linux: /proc). A worker names
    itself as it starts, so just after init_process_group it may not show yet; at a step's end it has."""
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            if (task / "comm").read_text().strip() == GLOO_WORKER_THREAD:
                return True
        except OSError:  # the thread ended while we looked
            continue
    return False


def exit_step(status: int) -> NoReturn:
    """End the process with ``status``; without interpreter finalization while gloo workers live.

    FSDP2 and DTensor keep a gloo process group alive past destroy_process_group, so its worker
    threads outlive the main thread. When one of them drops its last finished collective (which holds
    the ranks' tensors) after the main thread has begun finalizing, torch 2.13 takes the GIL to release
    a tensor, Python ends that thread inside a noexcept destructor, and the whole process aborts
    (SIGABRT, "terminate called without an active exception") after its work succeeded. Seen in a
    core dump of a finished 2-rank FSDP2 run: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork ->
    TensorImpl::decref_pyobject -> take_gil -> pthread_exit (pytorch/pytorch#190489). Everything a
    step writes is closed by then; flushing the log handlers and standard streams is what is left.
    """
    if gloo_workers_alive():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    raise SystemExit(status)
