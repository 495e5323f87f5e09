"""The question a command asks before it changes the cluster."""

from __future__ import annotations

import sys

from hpctl.common.errors import HpctlError


def confirm(question: str, *, yes: bool, stdin=None) -> None:
    """Go on only with --yes or a "y" typed at a terminal; without a terminal, --yes is the only way."""
    stdin = stdin or sys.stdin
    if yes:
        return
    if not stdin.isatty():
        raise HpctlError(f"{question.rstrip('?')}: no terminal to confirm at; rerun with --yes")
    print(f"{question} [y/N] ", end="", flush=True)
    if stdin.readline().strip().lower() not in ("y", "yes"):
        raise HpctlError("cancelled: nothing was changed")
