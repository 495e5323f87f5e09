"""The run folder's submit lock (llm_pipeline.jobs.run_lock) on a real file system, held by real processes: one
holder at a time, a waiting submission served when the holder ends, a lock left by a killed submit taken over
without manual cleanup, another host's lock trusted until it is stale, and a Slurm that does not answer refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from llm_pipeline.jobs import chain, pipeline_status, run_lock
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.jobs.run_lock import LOCK_FILE, STALE_S, Owner, RunLock, RunLocked
from llm_pipeline.run_files import StepJob

PAYLOADS = Path(__file__).resolve().parents[2] / "payloads"
# A process that takes the lock, says so, and holds it until its stdin closes.
HOLDER = (
    "import sys; from pathlib import Path; from llm_pipeline.jobs.run_lock import RunLock\n"
    "with RunLock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)
# A process that waits for the go file, then adds one to a counter under the lock, slowly (read, pause, write):
# two holders at once lose an increment.
COUNTER = (
    "import sys, time; from pathlib import Path; from llm_pipeline.jobs.run_lock import RunLock\n"
    "logs, go = Path(sys.argv[1]), Path(sys.argv[2])\n"
    "while not go.exists(): time.sleep(0.005)\n"
    "with RunLock(logs, wait_s=60):\n"
    "    count = logs / 'count'\n"
    "    n = int(count.read_text()) if count.exists() else 0\n"
    "    time.sleep(0.05)\n"
    "    count.write_text(str(n + 1))\n"
)


def python(code: str, *args: str, **popen) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(PAYLOADS)}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True, **popen)


def hold(logs: Path) -> subprocess.Popen[str]:
    holder = python(HOLDER, str(logs), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "held"
    return holder


def write_lock(logs: Path, owner: Owner, *, age_s: float = 0.0) -> Path:
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / LOCK_FILE
    path.write_text(json.dumps(asdict(owner)))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_a_second_holder_waits_then_is_refused_in_one_line_naming_the_holder(tmp_path):
    logs = tmp_path / "run" / "logs"
    holder = hold(logs)
    try:
        with pytest.raises(RunLocked) as refused, RunLock(logs, wait_s=0.5):
            pytest.fail("took a lock another process holds")
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"another submission of this run holds {logs / LOCK_FILE} (pid {holder.pid} on ")
        assert (logs / LOCK_FILE).is_file()  # the refused one removed nothing
    finally:
        holder.communicate("")
    assert holder.returncode == 0 and not (logs / LOCK_FILE).exists()


def test_a_waiting_submission_gets_the_lock_when_the_holder_ends(tmp_path):
    logs = tmp_path / "logs"
    holder = hold(logs)
    start = time.monotonic()
    threading.Timer(0.5, holder.stdin.close).start()  # the holder ends half a second from now
    with RunLock(logs, wait_s=30) as lock:
        assert time.monotonic() - start >= 0.5
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert holder.wait() == 0


def test_a_lock_left_by_a_killed_submit_is_taken_over_without_cleanup(tmp_path):
    logs = tmp_path / "logs"
    holder = hold(logs)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    left = json.loads((logs / LOCK_FILE).read_text())
    assert left["pid"] == holder.pid  # the killed submit's lock is still there
    with RunLock(logs, wait_s=0) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in logs.iterdir()) == []  # nothing left beside it


@pytest.mark.parametrize(
    "change, age_s, stale",
    [
        ({"pid": os.getpid(), "start": "1"}, 0, True),  # the pid runs, but it is another process (reused)
        ({"boot": "another boot"}, 0, True),  # taken before this host rebooted
        ({"host": "login-node"}, 60, False),  # another host's processes cannot be looked at: trusted...
        ({"host": "login-node"}, STALE_S + 60, True),  # ... until it is older than any submission takes
    ],
)
def test_whose_lock_is_stale(tmp_path, change, age_s, stale):
    logs = tmp_path / "logs"
    write_lock(logs, replace(Owner.me(), **change), age_s=age_s)
    if stale:
        with RunLock(logs, wait_s=0) as lock:
            assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    else:
        with pytest.raises(RunLocked, match=r"\(pid \d+ on login-node, for \d+ s\)"), RunLock(logs, wait_s=0.3):
            pass


def test_this_process_running_is_a_live_holder(tmp_path):
    """The lock's owner is checked by pid and start time: the very process that took it holds it."""
    logs = tmp_path / "logs"
    write_lock(logs, Owner.me())
    with pytest.raises(RunLocked), RunLock(logs, wait_s=0.2):
        pass


def test_an_unreadable_lock_is_held_until_it_is_stale(tmp_path):
    logs = tmp_path / "logs"
    path = write_lock(logs, Owner.me())
    path.write_text("{")
    with pytest.raises(RunLocked, match="its owner unreadable"), RunLock(logs, wait_s=0.2):
        pass
    os.utime(path, (time.time() - STALE_S - 1,) * 2)
    with RunLock(logs, wait_s=0):
        pass


@pytest.mark.parametrize("stale_first", [False, True])
def test_processes_racing_for_the_lock_hold_it_one_at_a_time(tmp_path, stale_first):
    """Eight processes released together add one each to a counter under the lock (read, pause, write): any
    overlap loses an increment. With ``stale_first``, they also race to take over a killed submit's lock."""
    logs, go = tmp_path / "logs", tmp_path / "go"
    if stale_first:
        dead = python("pass")
        dead.wait()
        write_lock(logs, replace(Owner.me(), pid=dead.pid))
    racers = [python(COUNTER, str(logs), str(go)) for _ in range(8)]
    time.sleep(1.0)  # every racer imported and waiting for the go file
    go.touch()
    assert [racer.wait(timeout=120) for racer in racers] == [0] * 8
    assert (logs / "count").read_text() == "8"
    assert sorted(p.name for p in logs.iterdir()) == ["count"]


def test_a_refused_submission_leaves_no_folder_behind(tmp_path):
    run = tmp_path / "outputs" / "run"
    with RunLock(run / "logs"):
        assert (run / "logs" / LOCK_FILE).is_file()
    assert not (tmp_path / "outputs").exists()


def test_a_lock_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "run").write_text("a file where the run folder should be")
    with pytest.raises(RunLocked) as refused, RunLock(tmp_path / "run" / "logs"):
        pass
    assert str(refused.value).startswith(f"cannot lock {tmp_path / 'run' / 'logs' / LOCK_FILE} (")
    assert "\n" not in str(refused.value)


def test_a_slurm_that_does_not_answer_refuses_the_submission(tmp_path, monkeypatch):
    """A recorded chain whose state Slurm cannot tell is no pass: one line, nothing submitted, lock released."""
    run = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'[paths]\noutput_dir = "{run}"\n')
    logs = run / "logs"
    logs.mkdir(parents=True)
    pipeline_status.write_record(logs, config, [StepJob("train", "41", str(logs / "train-41.log"))])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    facts = RunFacts(config=config, output_dir=run, nodes=1)
    with pytest.raises(chain.SubmitError) as refused, chain.one_chain(facts):
        pytest.fail("submitted while Slurm could not say whether the last chain lives")
    assert str(refused.value) == (
        f"cannot tell whether the last submission for {run} still runs (cannot reach Slurm: squeue: error: Unable "
        "to contact slurm controller): submit again once `squeue` answers"
    )
    assert not (logs / run_lock.LOCK_FILE).exists()
