"""Slurm unreachable is not a verdict: a failed squeue is reported as "cannot reach Slurm" and asked again; it
never turns a live run into LOST, NOT_RUN or FAILED (llm_pipeline.jobs.pipeline_status, submit status/--wait).

squeue here is a script on PATH that fails as a busy or down controller does, then (where a test says so)
answers with the jobs' states; sacct fails as on a cluster without accounting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_helpers import REPO

from llm_pipeline.jobs import pipeline_status
from llm_pipeline.jobs.chain import slurm
from llm_pipeline.run_files import StepJob, StepMarker

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-unreachable")]
DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
STEPS = ("prepare", "data", "train")


def write_run(tmp_path: Path) -> tuple[Path, Path]:
    """(run config, logs folder): a record of three jobs, the first done, the second running (its marker says so)."""
    run = tmp_path / "outputs" / "live"
    logs = run / "logs"
    (logs / "state").mkdir(parents=True)
    config = tmp_path / "live.toml"
    config.write_text(f'[paths]\noutput_dir = "{run}"\n')
    jobs = [StepJob(step, str(100 + i), str(logs / f"{step}-{100 + i}.log")) for i, step in enumerate(STEPS)]
    pipeline_status.write_record(logs, config, jobs)
    (logs / "state" / "prepare.json").write_text(StepMarker("prepare", "100", "COMPLETED", 0).to_json())
    (logs / "state" / "data.json").write_text(StepMarker("data", "101", "RUNNING", node="node1").to_json())
    return config, logs


def stub_slurm(folder: Path, *, failures: int) -> dict[str, str]:
    """PATH with squeue failing ``failures`` times (then listing the jobs as ended) and sacct without accounting."""
    folder.mkdir()
    count = folder / "calls"
    count.write_text("0")
    squeue = folder / "squeue"
    squeue.write_text(
        "#!/bin/bash\n"
        f"n=$(( $(cat {count}) + 1 )); echo $n > {count}\n"
        f'if [ $n -le {failures} ]; then echo "{DOWN}" >&2; exit 1; fi\n'
        "printf '100|COMPLETED|None\\n101|COMPLETED|None\\n102|COMPLETED|None\\n'\n"
    )
    sacct = folder / "sacct"
    sacct.write_text("#!/bin/bash\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    for script in (squeue, sacct):
        script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def status(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llm_pipeline.submit", "status", "--config", str(config), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "payloads", timeout=120)


def test_status_with_slurm_down_says_so_and_gives_no_verdict(tmp_path):
    config, _ = write_run(tmp_path)
    done = status(config, stub_slurm(tmp_path / "bin", failures=99))
    assert done.returncode == 2
    assert f"error: cannot reach Slurm: {DOWN}" in done.stderr
    asked = (done.stdout + done.stderr).count(f"cannot reach Slurm: {DOWN}")
    assert asked == pipeline_status.UNREACHABLE_RETRIES  # asked again before giving up
    for verdict in ("LOST", "NOT_RUN", "FAILED", "COMPLETED"):
        assert verdict not in done.stdout + done.stderr


def test_status_asks_again_and_reads_the_jobs_once_slurm_answers(tmp_path):
    config, _ = write_run(tmp_path)
    done = status(config, stub_slurm(tmp_path / "bin", failures=1))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"cannot reach Slurm: {DOWN} (try 1/" in done.stdout
    assert "pipeline: COMPLETED" in done.stdout and "LOST" not in done.stdout


def test_wait_rides_out_a_failing_poll(tmp_path):
    _, logs = write_run(tmp_path)
    env = stub_slurm(tmp_path / "bin", failures=2)
    said: list[str] = []
    previous = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]  # chain.slurm finds squeue on PATH, as submit --wait does
    try:
        states = pipeline_status.wait(logs, slurm, poll_s=0.01, echo=said.append)
    finally:
        os.environ["PATH"] = previous
    assert [s.state for s in states] == ["COMPLETED"] * 3
    assert sum("cannot reach Slurm" in line for line in said) == 1  # once per outage, not once per poll
    assert not any("LOST" in line or "NOT_RUN" in line for line in said)


# -- any sequence of polls -----------------------------------------------------------------------------------
JOB_STATES = st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"])
POLL = st.one_of(st.none(), st.tuples(JOB_STATES, JOB_STATES, JOB_STATES))  # None: squeue fails


@settings(max_examples=60, deadline=None)
@given(polls=st.lists(POLL, min_size=1, max_size=8))
def test_wait_ends_on_what_slurm_said_never_on_a_failed_poll(tmp_path_factory, polls):
    _, logs = write_run(tmp_path_factory.mktemp("run"))
    polls = [*polls, ("COMPLETED",) * 3]  # Slurm answers in the end
    asked = iter(polls)

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Slurm accounting storage is disabled")
        poll = next(asked)
        if poll is None:
            return subprocess.CompletedProcess(argv, 1, "", DOWN)
        listing = "".join(f"{100 + i}|{state}|None\n" for i, state in enumerate(poll))
        return subprocess.CompletedProcess(argv, 0, listing, "")

    said: list[str] = []
    states = pipeline_status.wait(logs, run, poll_s=0, echo=said.append)
    end = next(i for i, p in enumerate(polls) if p is not None and not set(p) & {"PENDING", "RUNNING"})
    assert tuple(s.state for s in states) == polls[end]
    assert not any(s.state in ("LOST", pipeline_status.NEVER_RAN) for s in states)
    asked_until_end = polls[: end + 1]
    outages = sum(
        1
        for before, poll in zip([(), *asked_until_end], asked_until_end, strict=False)
        if poll is None and before is not None
    )
    assert sum("cannot reach Slurm" in line for line in said) == outages


def test_a_record_without_jobs_is_no_success(tmp_path):
    assert pipeline_status.verdict([]) == (pipeline_status.NO_RECORD, None)
    assert pipeline_status.describe([])[-1].startswith("pipeline: no job recorded")
    (tmp_path / "logs").mkdir()
    assert pipeline_status.wait(tmp_path / "logs", slurm, poll_s=0, echo=print) == []  # a record gone mid-wait


def test_the_first_look_at_a_fresh_chain_is_one_line(tmp_path):
    _, logs = write_run(tmp_path)
    polls = iter([("PENDING",) * 3, ("RUNNING", "PENDING", "PENDING"), ("COMPLETED",) * 3])

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "")
        listing = "".join(f"{100 + i}|{state}|None\n" for i, state in enumerate(next(polls)))
        return subprocess.CompletedProcess(argv, 0, listing, "")

    said: list[str] = []
    pipeline_status.wait(logs, run, poll_s=0, echo=said.append)
    assert [line.split("] ", 1)[1].split()[:2] for line in said] == [
        ["3", "of"],  # "3 of 3 jobs PENDING", not a line per job
        ["prepare", "RUNNING"],
        ["prepare", "COMPLETED"],
        ["data", "COMPLETED"],
        ["train", "COMPLETED"],
    ]
