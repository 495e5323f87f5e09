"""`make rehearse` as a normal user: it says up front, before installing anything, that its local Slurm
needs root, and asks sudo once; with no sudo it stops there with what to do."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
# As root (CI), run as nobody; as a normal user, as that user.
SETPRIV = [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
AS_NORMAL_USER = SETPRIV if os.geteuid() == 0 else []


@pytest.fixture
def checkout() -> Iterator[Path]:
    """The Makefile and the check in a folder a normal user can read, with a PATH folder that has no sudo."""
    folder = Path(tempfile.mkdtemp(prefix="hpl-need-root-"))
    try:
        folder.chmod(0o755)
        (folder / "tools").mkdir(mode=0o755)
        shutil.copy(ROOT / "Makefile", folder / "Makefile")
        shutil.copy(ROOT / "tools" / "need_root.sh", folder / "tools" / "need_root.sh")
        (folder / "bin").mkdir(mode=0o755)
        for tool in ("bash", "id", "make", "sh", "env", "setsid"):
            (folder / "bin" / tool).symlink_to(shutil.which(tool))
        yield folder
    finally:
        shutil.rmtree(folder)


def run_as_normal_user(command: list[str], folder: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(folder / "bin"), "HOME": str(folder)}
    return subprocess.run([*AS_NORMAL_USER, *command], cwd=folder, env=env, capture_output=True, text=True)


def test_without_sudo_make_rehearse_stops_before_installing_and_says_why(checkout):
    done = run_as_normal_user(["make", "--no-print-directory", "rehearse"], checkout)
    assert done.returncode == 2
    assert "error: make rehearse runs a local Slurm whose daemons (munged, slurmctld, slurmd) must run as root" in (
        done.stderr
    )
    assert "nothing was installed: run it as root" in done.stderr
    assert "installing" not in done.stdout + done.stderr and not (checkout / ".venv").exists()


def fake_sudo(checkout: Path, body: str) -> Path:
    """A sudo that logs its arguments, then runs ``body`` (its exit status is sudo's); returns the log."""
    log = checkout / "sudo.log"
    log.touch(mode=0o666)
    log.chmod(0o666)
    sudo = checkout / "bin" / "sudo"
    sudo.write_text(f'#!{shutil.which("bash")}\necho "$*" >> {log}\n{body}\n')
    sudo.chmod(0o755)
    return log


def in_a_terminal(command: str) -> list[str]:
    """``command`` with a terminal of its own (script's pseudo-terminal), as when typed in one."""
    return [shutil.which("script") or "script", "-qec", command, "/dev/null"]


def test_with_sudo_it_says_why_and_asks_once_up_front(checkout):
    log = fake_sudo(checkout, '[[ "$1" != -n ]]')  # no password cached: only the prompting -v succeeds
    done = run_as_normal_user(in_a_terminal("bash tools/need_root.sh 'make rehearse-ladder'"), checkout)
    assert done.returncode == 0, done.stdout
    assert "note: make rehearse-ladder runs a local Slurm whose daemons" in done.stdout
    assert "sudo asks for your password once, now" in done.stdout
    assert log.read_text().splitlines() == ["-n true", "-v"]


def test_a_sudo_that_needs_no_password_is_used_without_asking(checkout):
    log = fake_sudo(checkout, "exit 0")  # sudo -v run earlier, or a NOPASSWD sudoers entry
    done = run_as_normal_user(["setsid", "-w", "bash", "tools/need_root.sh", "make rehearse"], checkout)
    assert done.returncode == 0, done.stderr
    assert "sudo, which needs no password now" in done.stderr and log.read_text().splitlines() == ["-n true"]


def test_without_a_terminal_it_says_in_one_line_how_to_run_it(checkout):
    """An IDE's run button or CI: no terminal for sudo's prompt (`sudo -S` reads a password nobody types)."""
    log = fake_sudo(checkout, '[[ "$1" != -n ]]')
    done = run_as_normal_user(["setsid", "-w", "bash", "tools/need_root.sh", "make rehearse"], checkout)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: make rehearse runs a local Slurm whose daemons") and "no terminal" in line
    assert "run `sudo -v` in a terminal first" in line and "or run it as root" in line
    assert log.read_text().splitlines() == ["-n true"]  # never prompts


def test_refused_sudo_stops_before_installing(checkout):
    fake_sudo(checkout, "exit 1")
    done = run_as_normal_user(in_a_terminal("bash tools/need_root.sh 'make rehearse'"), checkout)
    assert done.returncode == 2
    assert "error: sudo refused; nothing was installed: make rehearse needs root" in done.stdout


def touch_pinned(checkout: Path, *more: str) -> None:
    """What .venv is built from (and ``more``): present, so make -n gets to the rehearsal's own line."""
    pattern = r"^(?:\$\((?:REHEARSAL_)?STAMP\)|\$\(VENV\)/\.installed-hpctl): (.*)$"
    stamps = re.findall(pattern, (checkout / "Makefile").read_text(), re.M)
    pinned = [name for line in stamps for name in line.split() if not name.startswith("$(")]
    for name in [*pinned, *more]:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).touch()


def test_the_rehearsal_runs_through_sudo_only_for_a_normal_user(checkout):
    touch_pinned(checkout)
    as_user = run_as_normal_user(["make", "--no-print-directory", "-n", "rehearse"], checkout)
    assert as_user.returncode == 0, as_user.stderr
    assert f"sudo env PYTHONPATH={checkout}:{checkout}/payloads .venv/bin/python -m tools.rehearse" in as_user.stdout
    steps = as_user.stdout.splitlines()
    assert steps[0].startswith("tools/need_root.sh"), "the check comes before the system packages"
    if os.geteuid() == 0:
        as_root = subprocess.run(["make", "-n", "rehearse"], cwd=checkout, capture_output=True, text=True)
        assert "\n.venv/bin/python -m tools.rehearse" in as_root.stdout and "sudo" not in as_root.stdout


def test_a_missing_config_stops_make_rehearse_first_naming_the_file(checkout):
    done = run_as_normal_user(["make", "--no-print-directory", "rehearse", "CONFIG=configs/nope.toml"], checkout)
    assert done.returncode == 2
    assert done.stderr.startswith("error: CONFIG=configs/nope.toml: no such run config file"), done.stderr
    assert "root" not in done.stderr and not (checkout / ".venv").exists()  # before need-root and installing


def test_make_rehearse_passes_config_through_at_tiny_shape(checkout):
    touch_pinned(checkout, "configs/gpu.toml")
    done = run_as_normal_user(["make", "--no-print-directory", "-n", "rehearse", "CONFIG=configs/gpu.toml"], checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("-m tools.rehearse --config configs/gpu.toml --tiny")


def test_the_tools_scripts_are_shellcheck_clean():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    scripts = sorted(str(path) for path in (ROOT / "tools").glob("*.sh"))
    done = subprocess.run([str(shellcheck), *scripts], capture_output=True, text=True)
    assert len(scripts) >= 2 and done.returncode == 0, done.stdout


def test_the_rehearsal_says_a_tiny_models_answer_is_nonsense(tmp_path, capsys):
    from tools.rehearse import TINY_MODEL_NOTE, show_outputs

    (tmp_path / "generation.txt").write_text("### Instruction\nDescribe a llama?\n\n### Answer\n.\n")
    show_outputs(tmp_path)
    out = capsys.readouterr().out
    assert out.index(TINY_MODEL_NOTE) > out.index("### Answer") and "nonsense" in TINY_MODEL_NOTE
