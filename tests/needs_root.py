"""Tests that need root (a local Slurm's daemons, the lifecycle scripts' chown): for a normal user they fail
with one line saying so and what to run, instead of each failing its own way."""

from __future__ import annotations

import os

import pytest

HOW = "run the suite as root, as CI does (a root container, or `sudo -E make test` after `sudo -v`)"


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} need root: {HOW}", pytrace=False)
