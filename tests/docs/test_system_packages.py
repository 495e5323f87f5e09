"""tools/system_packages.sh: what `make test` installs on a fresh Debian/Ubuntu machine, and when it does nothing."""

from __future__ import annotations

import os
import re
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


def run(path: str, sbin_dirs: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": path, "HPL_SBIN_DIRS": sbin_dirs}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True)


def test_a_bare_machine_gets_slurm_munge_graphviz_and_prometheus(tmp_path):
    (tmp_path / "python3").symlink_to(sys.executable)  # what a bare machine has; no slurm, munge or dot
    for tool in ("sort", "sed", "env"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    log = fake_apt(tmp_path)
    done = run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    packages = [
        "graphviz",
        "mariadb-server",
        "munge",
        "prometheus",
        "prometheus-node-exporter",
        "slurm-wlm",
        "slurmdbd",
        "sudo",
    ]
    assert f"installing system packages: {' '.join(packages)}" in done.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].split()[-len(packages) :] == packages


def test_nothing_is_installed_when_everything_is_there(tmp_path):
    log = fake_apt(tmp_path)
    done = run(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert not log.exists()


def test_daemons_in_sbin_count_for_a_user_whose_path_leaves_sbin_out(tmp_path):
    """Debian puts slurmctld, slurmd and munged in /usr/sbin, outside a normal user's PATH."""
    sbin, bin_dir = tmp_path / "sbin", tmp_path / "bin"
    sbin.mkdir()
    bin_dir.mkdir()
    for tool in ("slurmctld", "slurmd", "munged", "slurmdbd", "mariadbd"):
        (sbin / tool).symlink_to(shutil.which("true"))
    for tool in ("sbatch", "dot", "prometheus", "prometheus-node-exporter", "sudo"):
        (bin_dir / tool).symlink_to(shutil.which("true"))
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("sort", "sed", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    log = fake_apt(bin_dir)
    sbin_packages = "mariadb-server munge slurm-wlm slurmdbd"
    assert run(str(bin_dir)).stdout == f"installing system packages: {sbin_packages}\n"  # sbin not searched
    log.unlink()
    done = run(str(bin_dir), sbin_dirs=str(sbin))
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert not log.exists()


def test_the_readme_and_make_help_name_every_package_it_installs():
    script = SCRIPT.read_text()
    pairs = re.search(r"for pair in (.*?); do", script, re.S).group(1)
    packages = {pair.split(":")[1] for pair in pairs.replace("\\", " ").split()}
    packages |= set(re.findall(r"missing\+=\(([\w-]+)\)", script))
    assert {"slurm-wlm", "munge", "graphviz", "prometheus", "prometheus-node-exporter", "python3-venv"} <= packages
    readme = " ".join((ROOT / "README.md").read_text().split())  # one line: a name may wrap
    make_help = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True)
    (help_line,) = [line for line in make_help.stdout.splitlines() if "make system-packages" in line]
    for package in sorted(packages):
        assert re.search(rf"(?<![\w-]){package}(?![\w-])", readme), f"README: {package} missing"
        assert re.search(rf"(?<![\w-]){package}(?![\w-])", help_line), f"make help: {package} missing"


def test_the_venv_module_is_checked_on_the_interpreter_make_makes_the_venv_with(tmp_path):
    """make passes its PYTHON (the distribution's python3, or the one named): python3-venv is installed when that
    one lacks the venv module, whatever python3 comes first on PATH."""
    for tool in ("slurmctld", "slurmd", "munged", "slurmdbd", "mariadbd", "sbatch", "dot", "prometheus", "sudo"):
        (tmp_path / tool).symlink_to(shutil.which("true"))
    (tmp_path / "prometheus-node-exporter").symlink_to(shutil.which("true"))
    (tmp_path / "python3").symlink_to(sys.executable)  # has ensurepip
    for tool in ("sort", "sed", "env"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    without_venv = tmp_path / "python-without-venv"
    without_venv.write_text("#!/bin/sh\nexit 1\n")  # `import ensurepip` fails, as on Debian without python3-venv
    without_venv.chmod(0o755)
    fake_apt(tmp_path)
    env = {"PATH": str(tmp_path), "HPL_SBIN_DIRS": ""}
    done = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    env["PYTHON"] = str(without_venv)
    done = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True)
    assert done.stdout == "installing system packages: python3-venv\n", done.stdout + done.stderr
