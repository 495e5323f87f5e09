"""The pipeline under a real local Slurm: a late step failing in smoke (the long training never starts), a
training cancelled by its user and resumed, the recovery drill on it and racing submissions. The default chain
end to end, every step's output asserted, is the newcomer journey's first `make rehearse`
(tests/docs/test_newcomer_journey.py); here the data step runs once and each run starts from a copy of its output.

Each test submits the real sbatch scripts with `python -m llm_pipeline.submit`, on the host
runtime with the tiny-cpu run config and a tiny random Llama (no downloads).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_helpers import LONG_STEPS, REPO, RUN_STEPS, SMOKE_JOBS, submit, wait_for

from llm_pipeline.jobs import estimate, pipeline_status, smoke
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import ALERTS_FILE, AlertLine, ProgressLine, StepMarker, SubmittedLine
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-pipeline")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def cluster(two_nodes, tmp_path_factory):
    """(environment for submit, folder for configs, the data step's output): FSx folders in a temp dir, inputs
    written and the data step run once; each test's run starts from a copy of its output (prepared). Two nodes:
    the drill fails one and the training moves to the other."""
    root = tmp_path_factory.mktemp("pipeline")
    env = two_nodes.env(fsx_environment(root / "fsx"))
    write_inputs(TINY, env, records=120)
    step_alone(env, "data", variant(root, "prepared"), run_dir(env, "prepared"))
    return env, root, run_dir(env, "prepared") / "data"


def variant(root: Path, name: str, **train: int) -> Path:
    """tiny-cpu.toml with its own run folder and some [train] keys set."""
    keys = {("train", key): value for key, value in train.items()}
    return write_derived(TINY, root / f"{name}.toml", keys, run_dir=f"${{HPL_OUTPUTS_DIR}}/{name}")


def run_dir(env: dict[str, str], name: str) -> Path:
    return Path(env["HPL_OUTPUTS_DIR"]) / name


def prepared(cluster, name: str, **train: int) -> tuple[Path, Path]:
    """(config, run folder) of a variant whose run folder holds a copy of the data step's output: its chains
    start from precompile (the data step in a chain is the newcomer journey's)."""
    env, root, data = cluster
    config = variant(root, name, **train)
    shutil.copytree(data, run_dir(env, name) / "data")
    return config, run_dir(env, name)


def step_alone(env: dict[str, str], step: str, config: Path, out_dir: Path) -> None:
    """<step>.sbatch alone (no chain, no record) into ``out_dir``, to its end: it must complete."""
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    step_env = {
        **env,
        "HPL_PAYLOADS_DIR": str(REPO / "payloads"),
        "HPL_RUN_CONFIG": str(config),
        "HPL_RUN_DIR": str(out_dir),
        "PYTHON": sys.executable,
    }
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={out_dir / 'logs' / f'{step}-%j.log'}",
            str(REPO / f"payloads/slurm/{step}.sbatch"),
        ],
        env=step_env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    wait_for(lambda: queue_is_empty(env), 300, f"the {step} step alone")
    log = (out_dir / "logs" / f"{step}-{job}.log").read_text()
    assert f"== {step}: COMPLETED" in log, log


def submitted_jobs(stdout: str) -> dict[str, str]:
    return SubmittedLine.jobs(stdout)


def queue_is_empty(env: dict[str, str]) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING"], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == ""


def marker(out_dir: Path, step: str) -> StepMarker:
    return StepMarker.from_json((out_dir / "logs" / "state" / f"{step}.json").read_text())


# A submission --from precompile with its smoke stage, in order (the shared steps, whose outputs the smoke stage
# reads from the run folder, are the newcomer journey's default chain; here the data step's output is a copy).
FIRST = LONG_STEPS[0]
CHAIN = [*SMOKE_JOBS, "estimate", *LONG_STEPS]


def test_late_smoke_failure_stops_the_chain_before_any_long_step(cluster):
    """Consolidate fails in the smoke stage, on a broken checkpoint: the long training never starts, and
    submit names the failed step and its log."""
    env = cluster[0]
    config, out_dir = prepared(cluster, "broken", max_steps=8, save_steps=4)
    smoke_dir = out_dir / smoke.SMOKE_FOLDER

    result = submit(env, config, "--from", FIRST)
    assert result.returncode == 0, result.stderr
    jobs = submitted_jobs(result.stdout)
    assert list(jobs) == CHAIN
    # Hold the smoke consolidation until the smoke training is done, then break its checkpoint.
    subprocess.run(["scontrol", "hold", jobs["smoke-consolidate"]], env=env, check=True)
    wait_for(
        lambda: (
            (smoke_dir / "logs" / "state" / "smoke-train-resume.json").is_file()
            and marker(smoke_dir, "smoke-train-resume").state != "RUNNING"
        ),
        300,
        "the smoke training",
    )
    weights = smoke_dir / "checkpoints" / f"checkpoint-{smoke.SMOKE_STEPS}" / "adapter_model.safetensors"
    weights.write_bytes(b"x" * weights.stat().st_size)  # same size: the checkpoint's seal still holds
    subprocess.run(["scontrol", "release", jobs["smoke-consolidate"]], env=env, check=True)

    wait_for(lambda: queue_is_empty(env), 300, "the chain to stop")
    status = submit(env, config, "status")
    failed_log = smoke_dir / "logs" / f"smoke-consolidate-{jobs['smoke-consolidate']}.log"
    assert status.returncode == 1
    assert (
        f"pipeline: FAILED at step smoke-consolidate (job {jobs['smoke-consolidate']}, FAILED): see {failed_log}"
        in status.stdout
    )
    assert "adapter_model.safetensors" in failed_log.read_text()
    # The failed step raised the run's one alert (env.sh -> jobs/alerts.py), in the folder it ran on.
    (alert,) = AlertLine.parse_all((smoke_dir / "logs" / ALERTS_FILE).read_text())
    assert (alert.step, alert.job, alert.state) == ("smoke-consolidate", jobs["smoke-consolidate"], "failed")
    assert not (out_dir / "logs" / ALERTS_FILE).exists()
    states = {
        s.step: s.state
        for s in pipeline_status.step_states(
            out_dir / "logs", lambda argv: subprocess.run(argv, env=env, capture_output=True, text=True)
        )
    }
    done = CHAIN.index("smoke-consolidate")
    assert states == {
        **{step: "COMPLETED" for step in CHAIN[:done]},
        "smoke-consolidate": "FAILED",
        **{step: "CANCELLED" for step in CHAIN[done + 1 :]},
    }
    # The long steps never started: no marker, no checkpoint, no estimate
    for step in LONG_STEPS:
        assert not (out_dir / "logs" / "state" / f"{step}.json").exists()
    assert not (out_dir / "checkpoints").exists() and not (out_dir / "logs" / estimate.ESTIMATE_FILE).exists()

    # Once Slurm has forgotten the jobs (MinJobAge), the step markers tell the same story.
    def forgotten(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0 if argv[0] == "squeue" else 1, "", "")

    later = pipeline_status.step_states(out_dir / "logs", forgotten)
    assert [s.state for s in later] == ["COMPLETED"] * done + ["FAILED"] + [pipeline_status.NEVER_RAN] * (
        len(CHAIN) - done - 1
    )
    assert pipeline_status.verdict(later)[1].step == "smoke-consolidate"


# Enough steps that each of the three faults (the user's cancel, a killed rank, a failed node) lands mid-attempt: the
# tiny model trains about ten steps a second here, and under make test's four workers a fault arrived up to 25 steps
# after the checkpoint it waited for (with 60 steps the failed node met a finished training); a save every few.
DRILL_STEPS, DRILL_SAVE = 100, 5
# The resumed run reads the checkpoint's weights, optimizer and RNG states: it must land on the uninterrupted
# run's adapter up to float reordering (measured: see docs/operations.md, "The recovery drill").
ADAPTER_TOLERANCE = 1e-5


def drill(env: dict[str, str], kind: str, out_dir: Path) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "llm_pipeline.jobs.drill", kind, "--run-dir", str(out_dir)],
        env={**env, "PYTHONPATH": str(REPO / "payloads")},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def newest_checkpoint(checkpoints: Path) -> int:
    return max(
        (int(p.parent.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*/trainer_state.json")), default=0
    )


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def test_drill_a_killed_rank_and_a_failed_node_recover_to_the_uninterrupted_adapter(cluster):
    """A user cancels the training mid-run and submits --from train: it resumes from its checkpoint. On that
    resubmitted training the rehearsal's drill (jobs/drill.py): a rank killed mid-run starts again in its
    allocation, a node failed mid-run sends the job back to Slurm, which runs it on the other node; each resumes
    from the newest complete checkpoint, the run finishes with the adapter of a run never interrupted, and
    logs/recovery.json has the figures. (The user's cancel comes first: a cancelled job writes no recovery.json.)"""
    env = cluster[0]
    drilled = dict(max_steps=DRILL_STEPS, save_steps=DRILL_SAVE, logging_steps=1)
    config, out_dir = prepared(cluster, "drill", **drilled, max_recoveries=2)
    checkpoints = out_dir / "checkpoints"

    first = submit(env, config, "--from", FIRST, "--no-smoke")  # the smoke stage is the journey's and the test above's
    assert first.returncode == 0, first.stderr
    jobs = submitted_jobs(first.stdout)
    busy = submit(env, config, "--from", "train")  # two trainings must never share a run folder
    assert busy.returncode == 2 and f"the last submission for {out_dir} is still going" in busy.stderr
    wait_for(lambda: newest_checkpoint(checkpoints) >= DRILL_SAVE, 300, "the first checkpoint")
    subprocess.run(["scancel", jobs["train"]], env=env, check=True)
    wait_for(lambda: queue_is_empty(env), 60, "the cancelled chain to clear")
    cancelled_at = max(int(p.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*"))
    assert DRILL_SAVE <= cancelled_at < DRILL_STEPS  # cancelled mid-run
    states = {
        s.step: s.state
        for s in pipeline_status.step_states(
            out_dir / "logs", lambda a: subprocess.run(a, env=env, capture_output=True, text=True)
        )
    }
    assert states["train"] == "CANCELLED" and states["generate"] == "CANCELLED"

    # The resubmission, followed (--wait) while the drill injects its faults into its training.
    started = time.monotonic()
    command = [sys.executable, "-m", "llm_pipeline.submit", "--from", "train", "--no-smoke", "--wait", "--poll", "1"]
    second = subprocess.Popen(
        [*command, "--config", str(config)],
        env=env,
        cwd=REPO / "payloads",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    failed_node = None
    try:
        # Its own first checkpoint: the resumed attempt is training.
        wait_for(lambda: newest_checkpoint(checkpoints) >= cancelled_at + DRILL_SAVE, 300, "the resumed training")
        assert "kill-rank on node" in drill(env, "kill-rank", out_dir)
        killed_at = newest_checkpoint(checkpoints)
        assert killed_at < DRILL_STEPS
        # The second attempt saved a checkpoint of its own: the node fails while it trains.
        wait_for(lambda: newest_checkpoint(checkpoints) >= killed_at + 2 * DRILL_SAVE, 300, "training after the kill")
        assert newest_checkpoint(checkpoints) < DRILL_STEPS, "the training ended before the node could fail: more steps"
        said = drill(env, "fail-node", out_dir)
        failed_node = re.search(r"fail-node on (\S+),", said).group(1)
        followed, errors = second.communicate(timeout=600)
    finally:
        if second.poll() is None:
            second.kill()
        if failed_node:
            subprocess.run(["scontrol", "update", f"nodename={failed_node}", "state=resume"], env=env, check=False)
    drilled_s = time.monotonic() - started
    assert second.returncode == 0, followed + errors
    resumed = submitted_jobs(followed)
    assert list(resumed) == list(RUN_STEPS[RUN_STEPS.index("train") :])
    train_log = (out_dir / "logs" / f"train-{resumed['train']}.log").read_text()
    # Its first attempt resumed from the cancelled training's checkpoint, and the step count went on from there.
    resumed_from = int(re.search(rf"resuming from {re.escape(str(checkpoints))}/checkpoint-(\d+)", train_log).group(1))
    assert DRILL_SAVE <= resumed_from <= cancelled_at
    first_logged = next(line.step for line in ProgressLine.parse_all(train_log) if line.total == DRILL_STEPS)
    assert first_logged > resumed_from  # it does not start again at 1
    final = checkpoints / f"checkpoint-{DRILL_STEPS}"
    assert json.loads((final / "trainer_state.json").read_text())["global_step"] == DRILL_STEPS
    assert (out_dir / "adapter" / "adapter_model.safetensors").is_file() and (out_dir / "generation.txt").is_file()
    # status keeps the first step of the first submission and the resubmitted steps after it
    status = submit(env, config, "status")
    assert status.returncode == 0 and status.stdout.strip().endswith("pipeline: COMPLETED"), status.stdout
    assert re.search(rf"(?m)^{FIRST} +{jobs[FIRST]} +COMPLETED", status.stdout)
    assert re.search(rf"(?m)^train +{resumed['train']} +COMPLETED", status.stdout)

    report = json.loads((out_dir / "logs" / "recovery.json").read_text())
    assert report["job"] == resumed["train"]
    kill, node = report["recoveries"]
    assert "Signal 9 (SIGKILL)" in kill["failed"] and kill["nodes_after"] == kill["nodes_before"]
    assert "requeued by Slurm" in node["failed"] and f"{failed_node} fail" in node["failed"]
    assert node["nodes_before"] == failed_node and node["nodes_after"] != failed_node  # on the healthy node
    for row in (kill, node):
        assert 0 <= row["time_to_detect_s"] <= row["time_to_resume_s"] < drilled_s
        assert row["steps_lost"] == row["last_step_before"] - row["resumed_from_step"]
        assert 0 <= row["steps_lost"] <= 2 * DRILL_SAVE and row["resumed_from_step"] % DRILL_SAVE == 0
        assert row["first_step_after"] == row["resumed_from_step"] + 1  # the loss curve continues
        assert row["replayed_loss_max_diff"] is None or row["replayed_loss_max_diff"] <= 1e-3
    # A cancel raises no alert; each recovery one, and the chain's end.
    recovered = [a for a in AlertLine.parse_all((out_dir / "logs" / ALERTS_FILE).read_text())]
    assert [a.state for a in recovered] == ["recovered", "recovered", "finished"]

    # The same run never interrupted: train.sbatch alone on a copy of the same data.
    reference, ref_dir = prepared(cluster, "drill-ref", **drilled)
    step_alone(env, "train", reference, ref_dir)
    resumed_adapter, uninterrupted = adapter(final), adapter(ref_dir / "checkpoints" / final.name)
    assert resumed_adapter.keys() == uninterrupted.keys()
    worst = max((resumed_adapter[k].float() - uninterrupted[k].float()).abs().max().item() for k in uninterrupted)
    print(f"drill: {report['recoveries']}; adapter max abs difference {worst:.3g}")
    assert worst <= ADAPTER_TOLERANCE


# Two submissions of one run, each process imported (it says so with its ready file) and waiting for the go file,
# so both ask at the same moment.
RACER = (
    "import sys, time; from pathlib import Path; from llm_pipeline import submit\n"
    "go = Path(sys.argv[1]); Path(sys.argv[2]).touch()\n"
    "while not go.exists(): time.sleep(0.002)\n"
    "sys.exit(submit.main(sys.argv[3:]))\n"
)
RACES = 20


def live_jobs(env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", "-t", "PENDING,RUNNING,CONFIGURING,COMPLETING", "-o", "%i"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_two_submissions_of_one_run_racing_make_one_chain(cluster, tmp_path):
    """Both released together, RACES times (every other time the second resubmits --from train): one chain,
    whose jobs are the winner's and the record's; the other is refused in one line naming them. The jobs
    are held (SBATCH_HOLD), then cancelled, so the next race finds that chain ended and may submit again."""
    env, root, _ = cluster
    env = {**env, "SBATCH_HOLD": "1"}
    config = variant(root, "race")
    out_dir = run_dir(env, "race")
    try:
        for race in range(RACES):
            go = tmp_path / f"go-{race}"
            second = ["--from", "train"] if race % 2 else []
            ready = [tmp_path / f"ready-{race}-{n}" for n in (1, 2)]
            racers = [
                subprocess.Popen(
                    [sys.executable, "-c", RACER, str(go), str(said), "--config", str(config), "--no-smoke", *args],
                    env=env,
                    cwd=REPO / "payloads",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for said, args in zip(ready, ([], second), strict=True)
            ]
            wait_for(lambda files=ready: all(f.exists() for f in files), 120, "both racers imported", poll=0.01)
            go.touch()
            outputs = [racer.communicate(timeout=120) for racer in racers]
            done = [(racer.returncode, *output) for racer, output in zip(racers, outputs, strict=True)]
            winners = [d for d in done if d[0] == 0]
            losers = [d for d in done if d[0] != 0]
            assert len(winners) == 1 and len(losers) == 1, f"race {race}: {done}"
            (_, stdout, _), (code, _, stderr) = winners[0], losers[0]
            jobs = list(submitted_jobs(stdout).values())
            assert jobs and live_jobs(env) == set(jobs), f"race {race}: a second chain was submitted: {done}"
            recorded = pipeline_status.read_record(out_dir / "logs")
            assert [job.job for job in recorded][-len(jobs) :] == jobs
            assert code == 2 and stderr.strip() == (
                f"error: the last submission for {out_dir} is still going (jobs {' '.join(jobs)}): wait for it "
                f"(status), or cancel it with `scancel {' '.join(jobs)}`, then submit again"
            ), f"race {race}: {done}"
            subprocess.run(["scancel", *jobs], env=env, check=True)
            wait_for(lambda: not live_jobs(env), 60, "the cancelled chain to clear")
    except BaseException:  # the cluster's other tests wait for an empty queue: leave no held job behind
        subprocess.run(["scancel", *live_jobs(env)], env=env, check=False)
        raise
    assert not (out_dir / "logs" / "submit.lock").exists()
