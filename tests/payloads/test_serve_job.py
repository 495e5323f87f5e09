"""The serve job's controller side and step, without vLLM: a run already served is refused before sbatch (squeue and
sbatch are stand-ins on PATH that record their calls), and the step picks the adapter over the base, else the merged
model, with a --max-lora-rank vLLM takes. The served job itself: tests/slurm/test_serve_rehearsal.py."""

from __future__ import annotations

import json

import pytest

from llm_pipeline.config import load
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import serve_job
from llm_pipeline.serve import TUNED_NAME, lora_rank, what_to_serve


def stand_in(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_a_run_whose_serve_job_is_queued_is_refused_before_sbatch(tmp_path, monkeypatch):
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    (run_dir / serve_job.SERVE_DIR).mkdir(parents=True)
    (run_dir / serve_job.SERVE_DIR / serve_job.JOB_FILE).write_text("41\n")
    stand_in(bin_dir, "squeue", 'echo "$@" >> "$0.calls"; echo 41')
    stand_in(bin_dir, "sbatch", 'echo "$@" >> "$0.calls"; echo 42')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(serve_job.ServeError, match="already served by job 41: stop it first"):
        serve_job.submit(run_dir, 1.0, wait_s=0)
    assert "-j 41" in (bin_dir / "squeue.calls").read_text()
    assert not (bin_dir / "sbatch.calls").exists()


def test_the_time_limit_is_in_whole_minutes_and_must_be_positive():
    assert (serve_job.time_limit(0.5), serve_job.time_limit(2), serve_job.time_limit(0.001)) == ("30", "120", "1")
    with pytest.raises(serve_job.ServeError, match="must be above 0"):
        serve_job.time_limit(0)


def test_the_adapter_is_served_over_the_base_else_the_merged_model(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'[paths]\nmodel_dir = "{tmp_path / "base"}"\noutput_dir = "{run_dir}"\n')
    with pytest.raises(StepError, match="neither an adapter"):
        what_to_serve(load(config))
    (run_dir / "merged").mkdir(parents=True)
    (run_dir / "merged" / "config.json").write_text("{}")
    assert what_to_serve(load(config)) == (run_dir / "merged", TUNED_NAME, [])
    (run_dir / "adapter").mkdir()
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 24}))
    model, name, extra = what_to_serve(load(config))
    assert (model, name) == (tmp_path / "base", "base")
    assert extra == ["--enable-lora", "--lora-modules", f"tuned={run_dir / 'adapter'}", "--max-lora-rank", "32"]
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(StepError, match="above vLLM's largest"):
        lora_rank(run_dir / "adapter")
