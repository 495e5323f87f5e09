"""What the benchmark scripts share: which shapes to run, how long to wait for a quiet disk, how a
report path, a model's size and the host are printed. Standard library only (a benchmark's parent
process stays small: a child's peak RSS counts the pages it was forked with).
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from bench.synthetic_llama import SHAPES

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3


def add_shapes(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--shapes", default=default, help="comma-separated: " + ", ".join(SHAPES))


def chosen_shapes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The --shapes list, in order; an unknown name stops with the known ones."""
    shapes = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in shapes if name not in SHAPES] or ([] if shapes else ["(none given)"])
    if unknown:
        parser.error(f"--shapes: unknown shape {unknown[0]} (known: {', '.join(SHAPES)})")
    return shapes


def add_quiet_disk_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quiet-disk-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="before each run, wait at most this long for the disk to go quiet (0: do not wait; smoke runs)",
    )


def shown(path: Path) -> str:
    """A report path as the user typed it relative to the repository, else absolute."""
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def sizes(parameters: int, nbytes: int) -> str:
    """'1.50B parameters, 3.00 GB' (millions and megabytes below a billion: the tiny shape)."""
    if parameters >= 1e9:
        return f"{parameters / 1e9:.2f}B parameters, {nbytes / 1e9:.2f} GB"
    return f"{parameters / 1e6:.2f}M parameters, {nbytes / 1e6:.2f} MB"


def machine() -> str:
    """'2 CPUs, 24 GiB RAM, Linux 6.8.0': the host line of the merge and consolidation reports."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{os.cpu_count()} CPUs, {ram:.0f} GiB RAM, {platform.system()} {platform.release()}"
