"""The local Slurm in a folder a normal user owns, as `make rehearse` runs it under sudo from a checkout in a
home folder: munged (root) refuses key, seed and log paths under another user's folder, so they live in
the system temp folder, and the cluster still starts, runs a job, and leaves munged's output in <root>/log."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tools.local_slurm import LocalSlurm, missing_binaries

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-local_slurm_owner")]
NOBODY = 65534  # a uid that is not root, as a home folder's owner is


@pytest.fixture
def home():
    """A user's folder (the cluster's root goes deep below it: slurmd's sockets must not)."""
    folder = Path(tempfile.mkdtemp(prefix="hpl-home-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_cluster_under_a_normal_users_folder_starts_and_runs_a_job(home):
    assert missing_binaries() == [], "`apt-get install -y slurm-wlm munge` (tools/system_packages.sh)"
    os.chown(home, NOBODY, NOBODY)
    # A checkout deep enough that <root>/spool/<node>/<node>_<job>.<step> passes a Unix socket name's 108 bytes.
    repo = home / "projects-of-a-normal-user" / "llm-fine-tuning-on-hyperpod-with-a-long-name" / "repo"
    root = repo / ".rehearsal" / "slurm"
    root.mkdir(parents=True)
    assert len(str(root / "spool" / "vm" / "vm_12345.4294967291")) > 108
    for folder in (*reversed(root.relative_to(home).parents), root):
        os.chown(home / folder, NOBODY, NOBODY)
    with LocalSlurm(root) as slurm:
        assert not slurm.munge_dir.is_relative_to(home)
        done = slurm.run("srun", "--quiet", "true", check=False)
        assert done.returncode == 0, done.stderr
        munge_dir = slurm.munge_dir
    assert not munge_dir.exists(), "the key and socket go with the cluster"
    assert "Starting munge" in (root / "log" / "munged.stdout").read_text()
