"""The ladder rehearsal shares the rehearsal's lock: a second one on the same folder is refused in one line,
naming the first's pid, and deletes nothing (no root or Slurm needed: it stops before starting either)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.rehearsal_lock import RehearsalLock

REPO = Path(__file__).resolve().parents[2]


def test_a_second_ladder_rehearsal_is_refused_while_one_holds_the_folder(tmp_path):
    root = tmp_path / "ladder"
    kept = root / "fsx" / "earlier-result.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("the first rehearsal's output\n")
    with RehearsalLock(root, what="ladder rehearsal"):
        result = subprocess.run(
            [sys.executable, "-m", "tools.rehearse_ladder", "--root", str(root)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'payloads'}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: another ladder rehearsal is running in {root} (pid {os.getpid()})")
    assert kept.read_text() == "the first rehearsal's output\n"
