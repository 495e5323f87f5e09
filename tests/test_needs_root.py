"""The tests that need root, run by a normal user: each says so in one line with what to run, no traceback.

As root (CI) they run in a user namespace of their own, where this process is not root (it has no root
powers on the host, yet reads the checkout and the venv as their owner); as a normal user, as that user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.needs_root import HOW

REPO = Path(__file__).resolve().parents[1]
AS_NORMAL_USER = [shutil.which("unshare") or "unshare", "--user"] if os.geteuid() == 0 else []
NEED_ROOT = (
    "tests/slurm/test_local_slurm_owner.py::test_a_cluster_under_a_normal_users_folder_starts_and_runs_a_job",
    "tests/lifecycle/test_lifecycle_roles.py::test_controller_gets_layout_profile_and_motd",
)


def test_a_normal_user_is_told_in_one_line_to_run_them_as_root(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NEED_ROOT]
    done = subprocess.run([*AS_NORMAL_USER, *command], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout[-2000:]
    lines = done.stdout.splitlines()
    for what in (
        "the local-Slurm tests (tests/slurm: munged, slurmctld and slurmd run as root)",
        "the lifecycle tests (they change file ownership as the scripts do on a node)",
    ):
        assert lines.count(f"{what} need root: {HOW}") == 1, done.stdout[-2000:]
    assert lines[-1].startswith(f"{len(NEED_ROOT)} errors in "), lines[-1]  # none ran, none failed its own way
    assert "Traceback" not in done.stdout and "LocalSlurmError" not in done.stdout
