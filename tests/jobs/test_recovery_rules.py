"""The rules of automatic recovery (llm_pipeline.jobs.recovery), each on a hand-written run folder: when it gives
up, which failure it does not retry, what each failure line records, and the figures of the report. The chain that
runs them on the local Slurm is tests/slurm/test_pipeline.py's drill; these take seconds."""

from __future__ import annotations

import json
import os
import stat
import time as clock

import pytest

from llm_pipeline.jobs import alerts, recovery
from llm_pipeline.run_files import (
    ALERTS_FILE,
    ATTEMPT,
    DRILL,
    FAILURE,
    RECOVERY_REPORT,
    RESUMING_FROM,
    AlertLine,
    BackendLine,
    ProgressLine,
    RecoveryLine,
    StepLog,
)

STEP, JOB = "train", "41"
T0 = 1_796_500_000.0  # an attempt's start, seconds since the epoch


def resuming(checkpoint: str) -> str:
    """The train step's own line for a resumed attempt (run_files.BackendLine)."""
    return BackendLine("training", "torch", f"{RESUMING_FROM}{checkpoint}").format() + "\n"


@pytest.fixture(autouse=True)
def no_topic(monkeypatch):
    monkeypatch.delenv(alerts.TOPIC_VARIABLE, raising=False)  # alerts stay in the run's alerts file


def progress(step: int, loss: float) -> str:
    return ProgressLine(step, 60, loss, 1e-4, 1.0, 100.0, "0:00:10").format() + "\n"


def write_log(run_dir, text: str) -> None:
    log = run_dir / "logs" / StepLog(STEP, JOB).name
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(text)


def write_lines(run_dir, *lines: RecoveryLine) -> None:
    for line in lines:
        recovery.append(run_dir, line)


def attempt(number: int, time: float, nodes: str = "node[1-2]", offset: int = 0) -> RecoveryLine:
    return RecoveryLine(time=time, event=ATTEMPT, step=STEP, job=JOB, attempt=number, nodes=nodes, offset=offset)


def failure(number: int, time: float, detail: str) -> RecoveryLine:
    return RecoveryLine(time=time, event=FAILURE, step=STEP, job=JOB, attempt=number, exit=1, detail=detail)


def test_gives_up_once_recoveries_exceed_max_recoveries(tmp_path, capsys):
    for number in (1, 2, 3):  # three attempts, each failed: two recoveries spent
        write_lines(tmp_path, attempt(number, T0 + 10 * number), failure(number, T0 + 10 * number + 5, "exit 1"))
    assert recovery.start_attempt(tmp_path, STEP, JOB, "node1", 2, now=T0 + 100) == recovery.GIVE_UP_EXIT
    err = capsys.readouterr().err
    assert err.startswith("error: step train (job 41) failed 3 times, more than train.max_recoveries = 2")
    assert len(err.strip().splitlines()) == 1
    assert [line.event for line in recovery.read_lines(tmp_path)].count(ATTEMPT) == 3  # no fourth attempt
    # One more allowed: the fourth attempt starts and tells so.
    assert recovery.start_attempt(tmp_path, STEP, JOB, "node1", 3, now=T0 + 100) == 0
    assert recovery.read_lines(tmp_path)[-1] == attempt(4, T0 + 100, nodes="node1")
    (told,) = AlertLine.parse_all((tmp_path / "logs" / ALERTS_FILE).read_text())
    assert told.state == recovery.RECOVERED and told.detail.startswith("attempt 4 of 4 resumes")


def test_failed_retries_within_max_recoveries_only(tmp_path):
    write_log(tmp_path, "step 1\n")
    write_lines(tmp_path, attempt(1, T0))
    assert recovery.attempt_failed(tmp_path, STEP, JOB, 1, max_recoveries=1)
    write_lines(tmp_path, attempt(2, T0 + 20, offset=7))
    assert not recovery.attempt_failed(tmp_path, STEP, JOB, 1, max_recoveries=1)


def test_a_failure_with_its_own_error_line_is_not_retried(tmp_path, capsys):
    refusal = "error: train.learning_rate = nan: the loss guard stopped training at step 4"
    write_log(tmp_path, progress(3, 1.5) + refusal + "\nsrun: error: node1: task 0: Exited with exit code 1\n")
    write_lines(tmp_path, attempt(1, T0))
    assert not recovery.attempt_failed(tmp_path, STEP, JOB, 1, max_recoveries=5)
    assert recovery.read_lines(tmp_path)[-1].detail == refusal.removeprefix("error: ")
    assert "a failure of its own: not retried" in capsys.readouterr().out


def test_an_error_line_of_an_earlier_attempt_does_not_stop_a_later_one(tmp_path):
    write_log(tmp_path, "error: a refusal fixed since\n")
    write_lines(tmp_path, attempt(1, T0), failure(1, T0 + 1, "a refusal fixed since"))
    later = len("error: a refusal fixed since\n")
    write_lines(tmp_path, attempt(2, T0 + 10, offset=later))
    write_log(tmp_path, "Signal 9 (SIGKILL) received by PID 811\n")
    assert recovery.attempt_failed(tmp_path, STEP, JOB, -9, max_recoveries=5)
    assert recovery.read_lines(tmp_path)[-1].detail == "Signal 9 (SIGKILL) received by PID 811"


@pytest.mark.parametrize(
    ("log", "recorded"),
    [
        (
            progress(5, 1.2)
            + "W torch.distributed.elastic.multiprocessing.api: Sending process 812 closing signal SIGTERM\n"
            + "torch.distributed.elastic.multiprocessing.api: failed (exitcode: -9) local_rank: 0 (pid: 811)\n"
            + "  exitcode  : -9 (pid: 811)\n  error_file: <N/A>\n"
            + "  traceback : Signal 9 (SIGKILL) received by PID 811\n"
            + "srun: error: node1: task 0: Exited with exit code 1\n",
            "Signal 9 (SIGKILL) received by PID 811",
        ),
        (
            progress(5, 1.2)
            + "srun: error: node2: task 1: Exited with exit code 1\n"
            + "srun: error: node1: task 0: Killed\n",
            "srun: error: node1: task 0: Killed",
        ),
        (progress(5, 1.2), "exit 137"),
    ],
    ids=["sigkill", "last-srun-error", "nothing-said"],
)
def test_a_failure_line_records_what_failed(tmp_path, log, recorded):
    write_log(tmp_path, log)
    write_lines(tmp_path, attempt(1, T0))
    recovery.attempt_failed(tmp_path, STEP, JOB, 137, max_recoveries=2)
    last = recovery.read_lines(tmp_path)[-1]
    assert (last.event, last.attempt, last.exit, last.detail) == (FAILURE, 1, 137, recorded)


def test_a_requeued_attempt_records_the_lost_nodes_and_slurms_requeue_time(tmp_path, monkeypatch):
    shims = tmp_path / "bin"
    shims.mkdir()
    # Slurm's own words: sinfo lists the failed node once per partition, scontrol stamps the requeue.
    (shims / "sinfo").write_text(
        "#!/bin/sh\nprintf 'node1 down* hpl-drill train job 41\\nnode1 down* hpl-drill train job 41\\n"
        "node2 idle none\\n'\n"
    )
    (shims / "scontrol").write_text("#!/bin/sh\necho 'JobId=41 JobName=hpl-train SubmitTime=2026-12-06T08:00:05'\n")
    for shim in shims.iterdir():
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    write_lines(run_dir, attempt(1, T0, nodes="node[1-2]"))  # ended with its allocation: no failure line
    assert recovery.start_attempt(run_dir, STEP, JOB, "node2", 2, now=T0 + 50) == 0
    lost, resumed = recovery.read_lines(run_dir)[1:]
    assert lost.event == FAILURE and lost.attempt == 1
    assert (
        lost.detail
        == "requeued by Slurm after attempt 1 on node[1-2]: node1 down* (hpl-drill train job 41); node2 idle"
    )
    assert lost.time == clock.mktime((2026, 12, 6, 8, 0, 5, 0, 0, -1))  # scontrol prints local time
    assert resumed == attempt(2, T0 + 50, nodes="node2")
    (told,) = AlertLine.parse_all((run_dir / "logs" / ALERTS_FILE).read_text())
    assert told.detail.endswith(f"after: {lost.detail}")


def test_report_figures_from_a_hand_written_recovery_file(tmp_path):
    run_dir = tmp_path
    first = progress(4, 2.0) + progress(5, 1.8) + progress(6, 1.7) + progress(7, 1.65)
    second = resuming("/fsx/outputs/run-a/checkpoints/checkpoint-5") + progress(6, 1.7004) + progress(7, 1.65)
    write_log(run_dir, first + second)
    other_job = RecoveryLine(time=T0 + 12, event=DRILL, step=STEP, job="40", nodes="node2", detail="fail-node")
    write_lines(
        run_dir,
        attempt(1, T0, nodes="node[1-2]"),
        other_job,  # another job's drill, in the same window: not this step's fault
        RecoveryLine(time=T0 + 30, event=DRILL, step=STEP, job=JOB, nodes="node1", detail="kill-rank on node1"),
        failure(1, T0 + 32.5, "Signal 9 (SIGKILL) received by PID 811"),
        attempt(2, T0 + 36, nodes="node[1-2]", offset=len(first)),
    )
    path = recovery.write_report(run_dir, STEP, JOB)
    assert path == run_dir / "logs" / RECOVERY_REPORT
    report = json.loads(path.read_text())
    assert report["step"] == STEP and report["job"] == JOB
    ((row,),) = [report["recoveries"]]
    assert row == {
        "attempt": 2,
        "fault": "kill-rank on node1",
        "failed": "Signal 9 (SIGKILL) received by PID 811",
        "nodes_before": "node[1-2]",
        "nodes_after": "node[1-2]",
        "time_to_detect_s": 2.5,
        "time_to_resume_s": 6.0,
        "last_step_before": 7,
        "resumed_from_step": 5,
        "steps_lost": 2,
        "first_step_after": 6,
        "replayed_loss_max_diff": pytest.approx(0.0004, abs=1e-9),
    }


def test_report_counts_a_requeue_without_a_drill_from_slurms_stamp(tmp_path):
    first = progress(9, 1.1)
    second = resuming("/fsx/outputs/run-a/checkpoints/checkpoint-10") + progress(11, 1.0)
    write_log(tmp_path, first + second)
    write_lines(
        tmp_path,
        attempt(1, T0, nodes="node[1-2]"),
        failure(1, T0 + 40, "requeued by Slurm after attempt 1 on node[1-2]"),
        attempt(2, T0 + 52, nodes="node2", offset=len(first)),
    )
    (row,) = recovery.figures(tmp_path, STEP, JOB)
    assert (row["fault"], row["time_to_detect_s"], row["time_to_resume_s"]) == ("", 0.0, 12.0)
    # resumed past the last logged step: nothing lost, not a negative count
    assert (row["steps_lost"], row["first_step_after"], row["replayed_loss_max_diff"]) == (0, 11, None)
