"""The ladder rehearsal shares the rehearsal's lock: a second one on the same folder is refused in one line,
naming the first's pid, and deletes nothing (no root or Slurm needed: it stops before starting either)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.needs_root import require_root
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


def test_the_stop_hint_works_for_the_user_who_reads_it():
    """The lock is root's (make rehearse runs through sudo): a normal user reading the refusal is told to use
    sudo; root, or the holder's own user, a plain kill."""
    require_root("the stop hint's check for another user")
    root = Path(tempfile.mkdtemp(prefix="hpl-lock-hint-"))  # a folder nobody can reach (tmp_path's parents: 0700)
    root.chmod(0o777)
    probe = "import sys\nfrom tools.rehearsal_lock import RehearsalLock as L\ntry:\n L(sys.argv[1]).acquire()\n"
    command = [sys.executable, "-c", probe + "except Exception as e:\n print(e)", str(root)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'payloads'}"}
    with RehearsalLock(root):
        (root / ".lock").chmod(0o666)  # the reader opens it before asking for the lock
        as_root = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        as_user = subprocess.run([*nobody, *command], cwd=REPO, env=env, capture_output=True, text=True).stdout
    shutil.rmtree(root)
    assert as_root.strip().endswith(f"(or `kill -INT {os.getpid()}`)"), as_root
    assert as_user.strip().endswith(f"(or `sudo kill -INT {os.getpid()}`)"), as_user
