"""The whole pipeline under a real local Slurm: end to end, a failing step, and a resumed training.

Each test submits the real sbatch scripts with `python -m llm_pipeline.submit`, on the host
runtime with the tiny-cpu run config and a tiny random Llama (no downloads).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import REPO, submit, wait_for

from llm_pipeline.jobs import pipeline_status
from llm_pipeline.submit import STEPS
from tools.rehearse import fsx_environment, write_inputs

pytestmark = pytest.mark.xdist_group("slurm")
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def cluster(one_node, tmp_path_factory):
    """(environment for submit, folder for configs): FSx folders in a temp dir, inputs written once."""
    root = tmp_path_factory.mktemp("pipeline")
    env = one_node.env(fsx_environment(root / "fsx"))
    write_inputs(TINY, env, records=120)
    return env, root


def variant(root: Path, name: str, **replace: str) -> Path:
    """tiny-cpu.toml with its own run folder and some keys replaced (key = TOML value)."""
    text = TINY.read_text()
    for key, value in {"output_dir": f'"${{HPL_OUTPUTS_DIR}}/{name}"', **replace}.items():
        text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert count == 1, f"tiny-cpu.toml has no single {key} line"
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


def run_dir(env: dict[str, str], name: str) -> Path:
    return Path(env["HPL_OUTPUTS_DIR"]) / name


def submitted_jobs(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"(?m)^submitted (\S+) job (\d+)$", stdout))


def queue_is_empty(env: dict[str, str]) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING"], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == ""


def marker(out_dir: Path, step: str) -> dict:
    return json.loads((out_dir / "logs" / "state" / f"{step}.json").read_text())


def test_whole_pipeline_produces_every_step_output(cluster):
    env, root = cluster
    config = variant(root, "e2e", max_steps="10", save_steps="5")
    out_dir = run_dir(env, "e2e")

    result = submit(env, config, "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = submitted_jobs(result.stdout)
    assert list(jobs) == list(STEPS)  # one job per step, in pipeline order
    assert "pipeline: COMPLETED" in result.stdout
    for step, job in jobs.items():
        log = (out_dir / "logs" / f"{step}-{job}.log").read_text()
        assert f"== {step}: COMPLETED (exit 0)" in log
        assert marker(out_dir, step) | {"time": None, "node": None} == {
            "step": step,
            "job": job,
            "state": "COMPLETED",
            "exit": 0,
            "time": None,
            "node": None,
        }

    logs = {step: (out_dir / "logs" / f"{step}-{job}.log").read_text() for step, job in jobs.items()}
    assert "run config ok" in logs["prepare"] and "transformers" in logs["prepare"]
    assert "nothing to download" in logs["download"]  # the tiny model sits where the download puts it
    assert any((out_dir / "data").iterdir())
    assert "nothing to do" in logs["precompile"]  # no Neuron devices here: torch backend
    assert "--nnodes=1" in logs["train"] and "--rdzv_backend=c10d" in logs["train"]
    assert max(int(p.name.split("-")[1]) for p in (out_dir / "checkpoints").glob("checkpoint-*")) == 10
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in (out_dir / "adapter").iterdir()}
    merged = {p.name for p in (out_dir / "merged").iterdir()}
    assert {"config.json", "tokenizer.json"} <= merged and any(name.endswith(".safetensors") for name in merged)
    generation = (out_dir / "generation.txt").read_text()
    assert "Describe a llama?" in generation and "### Answer" in generation

    status = submit(env, config, "status")
    assert status.returncode == 0 and status.stdout.strip().endswith("pipeline: COMPLETED")


def test_failed_step_cancels_the_rest_and_is_named(cluster):
    env, root = cluster
    config = variant(root, "broken", dataset='"${HPL_DATASETS_DIR}/no-such-file.jsonl"')
    out_dir = run_dir(env, "broken")

    result = submit(env, config, "--wait", "--poll", "1")
    jobs = submitted_jobs(result.stdout)
    assert result.returncode == 1
    assert f"pipeline: FAILED at step data (job {jobs['data']}, FAILED)" in result.stdout
    assert queue_is_empty(env)  # nothing left pending behind the failure

    status = submit(env, config, "status")
    assert status.returncode == 1
    assert (
        f"pipeline: FAILED at step data (job {jobs['data']}, FAILED): see {out_dir}/logs/data-{jobs['data']}.log"
        in status.stdout
    )
    states = {
        s.step: s.state
        for s in pipeline_status.step_states(
            out_dir / "logs", lambda argv: subprocess.run(argv, env=env, capture_output=True, text=True)
        )
    }
    assert states == {
        "prepare": "COMPLETED",
        "download": "COMPLETED",
        "data": "FAILED",
        **{step: "CANCELLED" for step in STEPS[3:]},
    }
    assert "no-such-file.jsonl" in (out_dir / "logs" / f"data-{jobs['data']}.log").read_text()
    assert marker(out_dir, "data")["state"] == "FAILED"
    assert not (out_dir / "logs" / "state" / "train.json").exists()  # the cancelled steps never started

    # Once Slurm has forgotten the jobs (MinJobAge), the step markers tell the same story.
    def forgotten(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0 if argv[0] == "squeue" else 1, "", "")

    later = pipeline_status.step_states(out_dir / "logs", forgotten)
    assert [s.state for s in later] == ["COMPLETED", "COMPLETED", "FAILED"] + [pipeline_status.NEVER_RAN] * 5
    assert pipeline_status.verdict(later)[1].step == "data"


def test_killed_training_resumes_from_its_checkpoint(cluster):
    env, root = cluster
    config = variant(root, "resume", max_steps="12", save_steps="4")
    out_dir = run_dir(env, "resume")
    checkpoints = out_dir / "checkpoints"

    first = submit(env, config, "--from", "data")
    assert first.returncode == 0, first.stderr
    jobs = submitted_jobs(first.stdout)
    busy = submit(env, config, "--from", "train")  # two trainings must never share a run folder
    assert busy.returncode == 2 and f"the last submission for {out_dir} is still going" in busy.stderr
    wait_for(lambda: (checkpoints / "checkpoint-4" / "trainer_state.json").is_file(), 300, "the first checkpoint")
    subprocess.run(["scancel", jobs["train"]], env=env, check=True)
    wait_for(lambda: queue_is_empty(env), 60, "the cancelled chain to clear")
    killed_at = max(int(p.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*"))
    assert 4 <= killed_at < 12  # killed mid-run
    states = {
        s.step: s.state
        for s in pipeline_status.step_states(
            out_dir / "logs", lambda a: subprocess.run(a, env=env, capture_output=True, text=True)
        )
    }
    assert states["train"] == "CANCELLED" and states["generate"] == "CANCELLED"

    second = submit(env, config, "--from", "train", "--wait", "--poll", "1")
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = submitted_jobs(second.stdout)
    assert list(resumed) == list(STEPS[STEPS.index("train") :])
    train_log = (out_dir / "logs" / f"train-{resumed['train']}.log").read_text()
    resumed_from = int(re.search(rf"resuming from {re.escape(str(checkpoints))}/checkpoint-(\d+)", train_log).group(1))
    assert 4 <= resumed_from <= killed_at
    first_logged = int(re.search(r"(?m)^step (\d+)/12", train_log).group(1))
    assert first_logged > resumed_from  # the step count continues; it does not start again at 1
    assert json.loads((checkpoints / "checkpoint-12" / "trainer_state.json").read_text())["global_step"] == 12
    assert (out_dir / "adapter" / "adapter_model.safetensors").is_file() and (out_dir / "generation.txt").is_file()

    # status keeps the data step of the first submission and the resubmitted steps after it
    status = submit(env, config, "status")
    assert status.returncode == 0 and status.stdout.strip().endswith("pipeline: COMPLETED")
    assert re.search(rf"(?m)^data +{jobs['data']} +COMPLETED", status.stdout)
    assert re.search(rf"(?m)^train +{resumed['train']} +COMPLETED", status.stdout)
