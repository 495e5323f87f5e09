"""tools/system_packages.sh: what `make test` installs on a fresh Debian/Ubuntu machine, and when it does nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "system_packages.sh"


def fake_apt(folder: Path) -> Path:
    """An apt-get that only records its arguments."""
    log = folder / "apt.log"
    apt = folder / "apt-get"
    apt.write_text(f'#!/bin/bash\necho "$*" >> {log}\n')
    apt.chmod(0o755)
    return log


def run(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env={"PATH": path}, capture_output=True, text=True)


def test_a_bare_machine_gets_slurm_munge_graphviz_and_prometheus(tmp_path):
    (tmp_path / "python3").symlink_to(sys.executable)  # what a bare machine has; no slurm, munge or dot
    for tool in ("sort", "sed", "env"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    log = fake_apt(tmp_path)
    done = run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    packages = ["graphviz", "munge", "prometheus", "prometheus-node-exporter", "slurm-wlm"]
    assert f"installing system packages: {' '.join(packages)}" in done.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].split()[-5:] == packages


def test_nothing_is_installed_when_everything_is_there(tmp_path):
    log = fake_apt(tmp_path)
    done = run(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert not log.exists()
