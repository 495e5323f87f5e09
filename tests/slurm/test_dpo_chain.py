"""SFT then DPO as one submission on a real local Slurm: a short SFT chain (from its data step: the tiny model is
written, and the DPO chain runs prepare and download), and right after it a DPO chain whose run
config names it (train.init_from), so the DPO chain's first job waits on the SFT chain's merge job; the DPO run
trains from the SFT run's merged model on a tiny preference set, then consolidates, merges, generates and
evaluates (the held-out pairs' reward figures in its report).

The SFT chain is submitted `--to merge`: the DPO chain needs its merge only (an SFT chain's generate and evaluate are
the newcomer journey's).
Both chains skip the smoke stage (--no-smoke), which would add eight jobs (measured alone: 387 s for the two chains with
the DPO chain's smoke stage, 161 s without): the newcomer journey's `make rehearse` runs it end to end on an SFT
chain, and what a DPO smoke run adds is tested in tests/payloads: its derived config starting from the same init run
(test_init_from.py), the DPO save and exact resume, evaluate on preference pairs and the estimate from the DPO data
report (test_dpo_run.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from slurm_helpers import REPO, RUN_STEPS, submit, wait_for

from llm_pipeline import config
from llm_pipeline.jobs.chain import AFTER_VARIABLE
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from llm_pipeline.submit import STEPS
from tools import tiny_model as tiny
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-dpo_chain")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"
SHORT = {("train", "max_steps"): 4, ("train", "save_steps"): 4, ("train", "logging_steps"): 1}


def step_logs(run: config.PathsConfig, jobs: dict[str, str]) -> dict[str, str]:
    """The long steps' logs (the smoke stage's lie in its own run folder)."""
    return {step: (run.logs_dir / f"{step}-{job}.log").read_text() for step, job in jobs.items() if step in STEPS}


def queue_is_empty(partition) -> bool:
    return partition.run("squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING").stdout.strip() == ""


def test_sft_then_dpo_submitted_back_to_back_runs_as_one_chain(one_node, tmp_path):
    started = time.monotonic()
    env = one_node.env(fsx_environment(tmp_path / "fsx"))
    sft_path = write_derived(TINY, tmp_path / "sft.toml", SHORT, run_dir="${HPL_OUTPUTS_DIR}/sft")
    write_inputs(sft_path, env, records=60)
    pairs = tiny.write_preference_jsonl(Path(env["HPL_DATASETS_DIR"]) / "pairs.jsonl", 24)
    dpo_keys = {
        **SHORT,
        ("train", "objective"): "dpo",
        ("train", "init_from"): "sft",
        ("paths", "model_dir"): None,  # train.init_from sets it
        ("data", "dataset"): str(pairs),
        ("data", "packing"): False,
        ("data", "validation_fraction"): 0.25,
    }
    dpo_path = write_derived(TINY, tmp_path / "dpo.toml", dpo_keys, run_dir="${HPL_OUTPUTS_DIR}/dpo")
    sft, dpo = (config.load(path, env=env).paths for path in (sft_path, dpo_path))

    missing = submit(env, dpo_path, "--no-smoke")  # no run "sft" yet
    assert missing.returncode == 2 and "submitted" not in missing.stdout
    assert f"train.init_from: no run sft in {Path(env['HPL_OUTPUTS_DIR'])}" in missing.stderr

    # the model is written: no prepare, no download; the DPO chain needs the SFT run's merged model only
    first = submit(env, sft_path, "--from", "data", "--to", "merge", "--no-smoke")
    assert first.returncode == 0, first.stdout + first.stderr
    sft_jobs = SubmittedLine.jobs(first.stdout)
    to_merge = RUN_STEPS[RUN_STEPS.index("data") : RUN_STEPS.index("merge") + 1]
    assert tuple(sft_jobs) == to_merge  # --to: nothing after the merge is submitted
    planned = submit(env, dpo_path, "--no-smoke", "--dry-run")  # the dry run shows the wait
    assert f"{AFTER_VARIABLE}={sft_jobs['merge']}" in planned.stdout, planned.stdout + planned.stderr
    (prepare,) = (line for line in planned.stdout.splitlines() if line.startswith("prepare_job="))
    assert f'--dependency=afterok:"${AFTER_VARIABLE}"' in prepare
    second = submit(env, dpo_path, "--no-smoke")
    assert second.returncode == 0, second.stdout + second.stderr
    dpo_jobs = SubmittedLine.jobs(second.stdout)
    assert f"starts after the merge job {sft_jobs['merge']} of {sft.output_dir}" in second.stdout, second.stdout
    waits = one_node.run("squeue", "-h", "-j", dpo_jobs["prepare"], "-o", "%E").stdout.strip()
    assert waits.startswith(f"afterok:{sft_jobs['merge']}"), waits  # the DPO chain's first job waits on the merge
    wait_for(lambda: queue_is_empty(one_node), 900, "both chains to end", poll=2)
    status = submit(env, dpo_path, "status")
    assert status.returncode == 0 and "pipeline: COMPLETED" in status.stdout, status.stdout + status.stderr
    status = submit(env, sft_path, "status")  # the chain --to merge, whole
    assert status.returncode == 0 and "pipeline: COMPLETED" in status.stdout, status.stdout + status.stderr
    assert (sft.merged_dir / "model.safetensors").is_file() and not sft.generation_file.exists()

    logs = step_logs(dpo, dpo_jobs)
    assert f"{sft.merged_dir} is train.init_from's merged model; nothing to download" in logs["download"]
    assert "reference: the policy with its adapter disabled" in logs["train"]
    assert [line.step for line in ProgressLine.parse_all(logs["train"])] == [1, 2, 3, 4]
    assert "eval_rewards/accuracies" in logs["train"]  # trl's held-out reward accuracy at the evaluation
    assert f"adapter written to {dpo.adapter_dir}: " in logs["consolidate"]
    assert f"merge: base {sft.merged_dir} " in logs["merge"]  # the DPO adapter added to the SFT model
    assert f"merged model written to {dpo.merged_dir}" in logs["merge"]
    assert str(dpo.merged_dir) in logs["generate"] and dpo.generation_file.is_file()
    dpo_model = (dpo.merged_dir / "model.safetensors").read_bytes()
    assert dpo_model != (sft.merged_dir / "model.safetensors").read_bytes()  # DPO changed the SFT model
    result = json.loads((dpo.eval_dir / "eval.json").read_text())
    assert result["base"]["model"] == str(sft.merged_dir) and result["held_out_rows"] == 6
    assert {"reward_accuracy", "reward_margin"} <= result.keys()
    assert "DPO reward accuracy" in (dpo.eval_dir / "report.md").read_text()
    print(f"SFT then DPO chains: {time.monotonic() - started:.0f} s")
