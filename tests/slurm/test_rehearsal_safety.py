"""`make rehearse` run twice, with a config it cannot run, pasted hints and Ctrl-C (tools/rehearse.py).

One real rehearsal (python -m tools.rehearse, as make runs it), training for hours, is started in one test and
followed until a job of its pipeline runs; a second one on the same folder is refused, the status line it
printed is pasted into a bare shell, and Ctrl-C ends it: one line, exit 130, no process of its cluster left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from slurm_helpers import REPO, wait_for

from llm_pipeline.jobs.run_config_text import write_derived
from tools.local_slurm import kill_processes_of, processes_of
from tools.rehearse import DEFAULT_CONFIG

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-rehearsal-safety")]
PYTHONPATH = os.pathsep.join((str(REPO), str(REPO / "payloads")))
RUNNING_JOB = re.compile(r"^\[ *\d+s\] \S+ +RUNNING ", re.MULTILINE)
LONG_RUN_STEPS = 1_000_000  # hours of training at the tiny model's pace: the run is interrupted long before


def rehearse_command(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tools.rehearse", "--root", str(root), *args]


def rehearsal_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    return {**env, "PYTHONPATH": PYTHONPATH}


def default_ctrl_c() -> None:
    """SIGINT as a terminal's foreground job has it: a runner started in the background (`nohup ... &`, a script's
    `&`) hands it on ignored, and Python then keeps it ignored, so the rehearsal would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """A rehearsal in its own process group (a terminal's foreground job), its output collected as it comes."""

    def __init__(self, root: Path, *args: str) -> None:
        self.root = root
        self.process = subprocess.Popen(
            rehearse_command(root, *args),
            cwd=REPO,
            env=rehearsal_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=default_ctrl_c,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._collect, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr))
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _collect(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def out(self) -> str:
        return "".join(self.stdout)

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return code


@pytest.fixture
def running(tmp_path_factory):
    """A rehearsal whose training runs for hours (train.max_steps), so its pipeline is still going at each check
    below, however loaded the machine; Ctrl-C ends it."""
    root = tmp_path_factory.mktemp("rehearsal")
    long_run = write_derived(
        DEFAULT_CONFIG, tmp_path_factory.mktemp("config") / "tiny-long.toml", {("train", "max_steps"): LONG_RUN_STEPS}
    )
    rehearsal = Running(root, "--config", str(long_run))
    try:
        wait_for(
            lambda: rehearsal.process.poll() is not None or RUNNING_JOB.search(rehearsal.out()),
            300,
            "a job of the rehearsal's pipeline to run",
            poll=0.5,
        )
        assert rehearsal.process.poll() is None, rehearsal.out() + "".join(rehearsal.stderr)
        yield rehearsal
    finally:
        if rehearsal.process.poll() is None:
            os.killpg(rehearsal.process.pid, signal.SIGINT)
            try:
                rehearsal.finish(120)
            except subprocess.TimeoutExpired:
                rehearsal.process.kill()
        kill_processes_of(root / "slurm" / "slurm.conf")  # a failed check leaves no job training on


def second_rehearsal_on_the_same_folder_is_refused_naming_the_first(running: Running) -> None:
    conf = running.root / "slurm" / "slurm.conf"
    second = subprocess.run(
        rehearse_command(running.root), cwd=REPO, env=rehearsal_env(), capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
    assert f"another rehearsal is running in {running.root} (pid {running.process.pid})" in second.stderr
    assert second.stdout == ""
    assert conf.is_file() and (running.root / "fsx").is_dir()  # it deleted nothing of the first's
    assert running.process.poll() is None


def status_line_it_prints_works_pasted_into_a_bare_shell(running: Running, tmp_path: Path) -> None:
    hint = re.search(r"^status: (.+)$", running.out(), re.MULTILINE)
    assert hint, running.out()
    bare = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}  # no venv, PYTHONPATH or SLURM_CONF
    pasted = subprocess.run(
        ["bash", "-c", hint[1]], cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=120
    )
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert "pipeline: RUNNING, at step" in pasted.stdout
    assert not re.search(r"\b(LOST|NOT_RUN|FAILED)\b", pasted.stdout), pasted.stdout


def ctrl_c_stops_the_cluster_and_its_jobs_in_one_line(running: Running) -> None:
    conf = running.root / "slurm" / "slurm.conf"
    assert processes_of(conf)  # the daemons and the running job's processes
    before = len(running.stderr)
    os.killpg(running.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends its foreground job
    code = running.finish(120)
    assert code == 130, running.out() + "".join(running.stderr)
    stderr = "".join(running.stderr[before:])
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    said = [line for line in stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("interrupted: "), stderr
    assert processes_of(conf) == []  # no job step outlives its cluster


def test_a_running_rehearsal_refuses_a_second_its_status_hint_works_pasted_and_ctrl_c_ends_it(running, tmp_path):
    """One test for the three, in order: a module fixture would keep the rehearsal training while xdist runs
    other modules' tests on this worker between them."""
    second_rehearsal_on_the_same_folder_is_refused_naming_the_first(running)
    status_line_it_prints_works_pasted_into_a_bare_shell(running, tmp_path)
    ctrl_c_stops_the_cluster_and_its_jobs_in_one_line(running)


def test_a_config_it_cannot_run_is_refused_before_anything_is_deleted(tmp_path):
    kept = tmp_path / "slurm" / "earlier-results.txt"
    kept.parent.mkdir()
    kept.write_text("the last rehearsal's\n")
    config = REPO / "payloads" / "configs" / "default.toml"  # the trn1 run
    done = subprocess.run(
        rehearse_command(tmp_path, "--config", str(config), "--tiny"),
        cwd=REPO,
        env=rehearsal_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: CONFIG={config}: train.backend = 'auto':" in done.stderr
    assert "covered by `make test-trn1`" in done.stderr
    # no "[1/4] starting a local Slurm", and the folder as it was
    assert done.stdout == "" and kept.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["slurm"]
