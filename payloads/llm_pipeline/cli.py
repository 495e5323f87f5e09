"""What every step's command line shares: `--config`, clear `error: ...` lines, exit codes.

Bad input (a ConfigError or StepError) prints one line on stderr and exits 2, the same code argparse
uses for bad arguments, so the Slurm scripts and the user see a reason rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from llm_pipeline.config import ConfigError, RunConfig, load
from llm_pipeline.errors import StepError

BAD_INPUT = 2


def parser(step: str, description: str) -> argparse.ArgumentParser:
    """An argument parser for `python -m llm_pipeline.<step>` with the shared --config option."""
    result = argparse.ArgumentParser(prog=f"python -m llm_pipeline.{step}", description=description)
    result.add_argument("--config", required=True, metavar="RUN.toml", help="the run config (see payloads/configs/)")
    return result


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
    except (ConfigError, StepError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return BAD_INPUT
    return 0
