"""The rehearsal's --method: every train.method gets a valid run config, and the pipeline from its data step
runs with full fine-tuning, without the smoke stage (consolidate writes the model folder, merge has nothing to
do, generate uses it), then is extended: refused while its outputs lie in the run folder, resumed with
--replace-outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import REPO, RUN_STEPS, submit

from llm_pipeline import config
from llm_pipeline.config import METHODS
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from tools.rehearse import fsx_environment, method_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-pipeline_methods")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


@pytest.mark.parametrize("method", METHODS)
def test_rehearsal_config_for_each_method(tmp_path, method):
    path = method_config(TINY, method, tmp_path)
    env = {name: str(tmp_path) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    cfg = config.load(path, env=env)
    assert cfg.train.method == method
    assert cfg.train.backend == "torch"  # the rehearsal's CPU backend runs every method
    config.check_backend(cfg, "torch")
    (tmp_path / "again").mkdir()
    twice = method_config(path, "lora", tmp_path / "again")
    assert config.load(twice, env=env).train.method == "lora"  # an existing method line is replaced


def set_keys(path, **train: int) -> None:
    write_derived(path, path, {("train", key): value for key, value in train.items()})


def logged_losses(train_log: str) -> dict[int, float]:
    return {line.step: line.loss for line in ProgressLine.parse_all(train_log)}


def test_pipeline_runs_full_fine_tuning_end_to_end(one_node, tmp_path):
    env = one_node.env(fsx_environment(tmp_path / "fsx"))
    path = method_config(TINY, "full", tmp_path)
    set_keys(path, max_steps=6, logging_steps=2, save_steps=3)
    write_inputs(path, env, records=80)
    # From data (the model is written: prepare and download have nothing of full fine-tuning's to do) and without
    # the smoke stage: full fine-tuning's save and resume is the extension's below; the smoke stage and `status`'s
    # estimate of a finished chain with one are the newcomer journey's and test_ladder.py's
    result = submit(env, path, "--from", "data", "--no-smoke", "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    out_dir = config.load(path, env=env).paths
    logs = {p.name.split("-")[0]: p.read_text() for p in (out_dir.logs_dir).glob("*-*.log")}
    assert "method full: 87,360 trainable parameters" in logs["train"]
    assert f"model folder written to {out_dir.merged_dir}" in logs["consolidate"]
    assert "nothing to merge for train.method full" in logs["merge"]
    assert not out_dir.adapter_dir.exists()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out_dir.merged_dir.iterdir()}
    assert str(out_dir.merged_dir) in logs["generate"]
    assert "### Answer" in out_dir.generation_file.read_text()
    losses = logged_losses(logs["train"])
    assert sorted(losses) == [2, 4, 6] and losses[6] < losses[2]  # every parameter trains: the loss falls
    assert list(SubmittedLine.jobs(result.stdout)) == list(RUN_STEPS[RUN_STEPS.index("data") :])
    status = submit(env, path, "status")  # a finished chain without a smoke stage: no estimate to show
    assert status.returncode == 0 and "pipeline: COMPLETED" in status.stdout, status.stdout + status.stderr
    assert "estimate from the smoke run" not in status.stdout

    # The finished run extended (this also holds test_pipeline.py's former extension test): submit refuses in
    # seconds while the step-6 outputs lie in the run folder; with --replace-outputs they move aside whole, the
    # training resumes from checkpoint-6, its step count continues at 7, and every output comes from checkpoint-8.
    step6 = (out_dir.merged_dir / "model.safetensors").read_bytes()
    set_keys(path, max_steps=8)
    refused = submit(env, path, "--from", "train")
    assert refused.returncode == 2 and "submitted" not in refused.stdout
    assert "holds outputs of an earlier training (merged, generation.txt, eval)" in refused.stderr
    assert "--replace-outputs" in refused.stderr and "error:" in refused.stderr
    again = submit(env, path, "--from", "train", "--replace-outputs", "--wait", "--poll", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "pipeline: COMPLETED" in again.stdout
    (aside,) = (Path(out_dir.output_dir) / "replaced").iterdir()
    assert f"moved aside: merged, generation.txt, eval -> {aside}" in again.stdout
    assert (aside / "merged" / "model.safetensors").read_bytes() == step6
    jobs = SubmittedLine.jobs(again.stdout)
    resumed = (out_dir.logs_dir / f"train-{jobs['train']}.log").read_text()
    assert f"resuming from {out_dir.checkpoints_dir}/checkpoint-6" in resumed
    assert sorted(logged_losses(resumed)) == [8]  # the step count continues at 7
    consolidated = (out_dir.logs_dir / f"consolidate-{jobs['consolidate']}.log").read_text()
    assert f"full-model checkpoint {out_dir.checkpoints_dir}/checkpoint-8 -> {out_dir.merged_dir}" in consolidated
    assert (out_dir.merged_dir / "model.safetensors").read_bytes() != step6
    assert out_dir.generation_file.is_file() and (out_dir.eval_dir / "eval.json").is_file()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out_dir.merged_dir)  # the folder loads with plain transformers
    assert sum(p.numel() for p in model.parameters()) == 87_360
