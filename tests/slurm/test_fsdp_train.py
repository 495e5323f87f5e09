"""FSDP2 training under the local Slurm: two nodes, one process each, gloo, through train.sbatch and
the Slurm-derived torchrun rendezvous. The losses equal one process's over several steps (LoRA, full fine-tuning,
LoRA DPO), a restarted job resumes exactly from the newest complete sharded checkpoint, and
the sharded full-model checkpoint consolidates into a model folder that loads."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, wait_for

from llm_pipeline import compare, config, consolidate, data, train
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import StepMarker
from tools import tiny_model as tiny
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-fsdp_train")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"
STEPS = 4
LEAKED_PREFIXES = ("ACCELERATE_", "FSDP_")


@pytest.fixture(scope="module")
def cluster(two_nodes, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    # transformers exports ACCELERATE_*/FSDP_* settings whenever a process builds trainer arguments: an
    # earlier in-process training (another test) must not leak its precision or FSDP mode into the jobs
    base = {k: v for k, v in os.environ.items() if not k.startswith(LEAKED_PREFIXES)}
    env = two_nodes.env(fsx_environment(root / "fsx", base))
    write_inputs(TINY, env, records=80)
    return env, root


def write_run(root: Path, name: str, *, method: str, processes: int, extra: dict | None = None) -> Path:
    """tiny-cpu.toml for `processes` ranks with the same global batch (4) and no evaluation (``extra``: more keys)."""
    keys = {
        ("data", "validation_fraction"): 0.0,
        ("train", "per_device_batch_size"): 4 // processes,
        ("train", "max_steps"): STEPS,
        ("train", "save_steps"): 2,
        ("train", "logging_steps"): 1,
        ("parallel", "nodes"): processes,
        ("train", "method"): method,
        ("parallel", "strategy"): "fsdp",
        # The weights are compared with one process's to 1e-5 after Adam's first steps, whose update of a
        # near-zero gradient follows its sign (reduction order can flip it); the whole-text loss gives every
        # weight a clear gradient, the answers-only loss leaves more of them near zero.
        ("data", "completion_only_loss"): False,
        **(extra or {}),
    }
    return write_derived(TINY, root / f"{name}.toml", keys, run_dir=f"${{HPL_OUTPUTS_DIR}}/{name}")


def sbatch_train(env: dict[str, str], run_config: Path, cfg: config.RunConfig) -> str:
    """train.sbatch on both nodes; returns its log after the job ends (asserting it completed)."""
    run_dir = Path(cfg.paths.output_dir)
    log = run_dir / "logs" / f"train-{len(list(run_dir.glob('logs/train-*.log')))}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    marker = run_dir / "logs" / "state" / "train.json"
    marker.unlink(missing_ok=True)
    job_env = dict(
        env,
        HPL_PAYLOADS_DIR=str(REPO / "payloads"),
        HPL_RUN_CONFIG=str(run_config),
        HPL_RUN_DIR=str(run_dir),
        PYTHON=sys.executable,
    )
    script = REPO / "payloads" / "slurm" / "train.sbatch"
    command = ["sbatch", "--parsable", "--nodes=2", f"--output={log}", str(script)]
    job = subprocess.run(command, env=job_env, capture_output=True, text=True, check=True).stdout.strip()

    def ended() -> bool:
        return marker.is_file() and StepMarker.from_json(marker.read_text()).state != "RUNNING"

    wait_for(ended, 600, f"train job {job}")
    assert StepMarker.from_json(marker.read_text()).state == "COMPLETED", log.read_text()[-3000:]
    return log.read_text()


def one_process(env: dict[str, str], run_config: Path) -> config.RunConfig:
    with contextlib.redirect_stdout(io.StringIO()):
        assert train.main(["--prepare-data", "--config", str(run_config)]) == 0
    return config.load(run_config, env=env)


def losses(cfg: config.RunConfig, step: int = STEPS) -> list[float]:
    state = json.loads((cfg.paths.checkpoints_dir / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


@pytest.fixture(scope="module")
def hpl_environment(cluster):
    """The HPL_* variables in this process too: the one-process runs and consolidate read them."""
    env, _ = cluster
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            if key.startswith("HPL_"):
                patch.setenv(key, value)
        for key in [k for k in os.environ if k.startswith(LEAKED_PREFIXES)]:
            patch.delenv(key)
        yield env


def train_pair(cluster, method: str, name: str = "", extra: dict | None = None):
    """(two-rank FSDP2 run config, its config, one-process config, the FSDP job's log)."""
    env, root = cluster
    name = name or method
    two = write_run(root, f"{name}-fsdp", method=method, processes=2, extra=extra)
    one = write_run(root, f"{name}-one", method=method, processes=1, extra=extra)
    two_cfg = config.load(two, env=env)
    with contextlib.redirect_stdout(io.StringIO()):
        data.prepare(two_cfg)  # several processes need the data step first
    log = sbatch_train(env, two, two_cfg)
    return two, two_cfg, one_process(env, one), log


@pytest.fixture(scope="module")
def lora_runs(cluster, hpl_environment):
    return train_pair(cluster, "lora")


@pytest.fixture(scope="module")
def full_runs(cluster, hpl_environment):
    return train_pair(cluster, "full")


@pytest.fixture(scope="module")
def dpo_runs(cluster, hpl_environment):
    """LoRA DPO (train.objective dpo, the adapter-disabled reference) on tiny preference pairs."""
    env, _ = cluster
    pairs = tiny.write_preference_jsonl(Path(env["HPL_DATASETS_DIR"]) / "pairs.jsonl", 40)
    keys = {("train", "objective"): "dpo", ("data", "dataset"): str(pairs), ("data", "packing"): False}
    return train_pair(cluster, "lora", name="dpo", extra=keys)


@pytest.mark.parametrize("runs", ["lora_runs", "full_runs", "dpo_runs"])
def test_two_ranks_match_one_process_step_by_step(request, runs):
    _, fsdp, single, log = request.getfixturevalue(runs)
    assert "2 process(es), FSDP2" in log and "2 data-parallel replica(s)" in log
    assert len(losses(fsdp)) == STEPS
    assert losses(fsdp) == pytest.approx(losses(single), abs=1e-4)
    if fsdp.train.objective == "dpo":  # four noisy pairs' batches: no trend, but the policy leaves its reference
        assert losses(fsdp)[0] == pytest.approx(math.log(2), abs=1e-6)  # the adapter disabled: policy = reference
        assert all(abs(loss - math.log(2)) > 1e-4 for loss in losses(fsdp)[1:])
    else:
        assert losses(fsdp)[-1] < losses(fsdp)[0]
    checkpoint = fsdp.paths.checkpoints_dir / f"checkpoint-{STEPS}"
    shards = sorted(p.name for p in (checkpoint / "pytorch_model_fsdp_0").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # one shard per rank
    assert (checkpoint / "optimizer_0" / ".metadata").is_file()
    # adapter methods: the gathered adapter rides along for consolidate and generate, equal to the
    # adapter one process trained
    assert (checkpoint / "adapter_model.safetensors").is_file() == (fsdp.train.method == "lora")
    if fsdp.train.method == "lora":
        import torch
        from safetensors.torch import load_file

        gathered = load_file(checkpoint / "adapter_model.safetensors")
        alone = load_file(single.paths.checkpoints_dir / f"checkpoint-{STEPS}" / "adapter_model.safetensors")
        assert set(gathered) == set(alone)
        for name, tensor in alone.items():
            torch.testing.assert_close(gathered[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("runs", ["lora_runs", "full_runs"])
def test_compare_says_two_ranks_match_one_process(request, runs, tmp_path):
    """The loss-parity gate for 1 process vs 2 FSDP2 ranks, through the compare command and its
    tolerance (tests/payloads/test_loss_parity.py states how it was chosen)."""
    _, fsdp, single, _ = request.getfixturevalue(runs)
    runs_compared = [single.paths.output_dir, fsdp.paths.output_dir, "--labels", "one-process,fsdp2-2-ranks"]
    code = compare.main([*runs_compared, "--output", str(tmp_path), "--steps", str(STEPS), "--tolerance", "0.005"])
    result = json.loads((tmp_path / "compare.json").read_text())
    assert code == 0 and result["verdict"] == "match", result
    assert result["runs"][1]["points_compared"] == STEPS and result["runs"][1]["kind"] == "events"
    # same global batch, same sequence length: the same tokens per step
    assert result["runs"][0]["tokens_per_step"] == result["runs"][1]["tokens_per_step"] == 4 * 128


def test_restarted_job_resumes_exactly_from_the_newest_complete_checkpoint(lora_runs, cluster):
    run_config, fsdp, _, _ = lora_runs
    env, _ = cluster
    uninterrupted = losses(fsdp)
    shutil.rmtree(fsdp.paths.checkpoints_dir / f"checkpoint-{STEPS}")  # as if the job died after step 2
    (fsdp.paths.checkpoints_dir / "checkpoint-3").mkdir()  # half-written: no trainer_state.json
    log = sbatch_train(env, run_config, fsdp)
    assert f"resuming from {fsdp.paths.checkpoints_dir / 'checkpoint-2'}" in log
    assert "step 3/4 | loss" in log and "step 1/4" not in log
    # same weights, optimizer moments, scheduler and data position: the same losses to the digit
    assert losses(fsdp) == uninterrupted


def test_sharded_full_checkpoint_consolidates_to_a_loadable_model(full_runs):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run_config, fsdp, single, _ = full_runs
    with contextlib.redirect_stdout(io.StringIO()):
        assert consolidate.main(["--config", str(run_config)]) == 0
    model = AutoModelForCausalLM.from_pretrained(fsdp.paths.merged_dir)
    reference = load_file(single.paths.checkpoints_dir / f"checkpoint-{STEPS}" / "model.safetensors")
    assert set(reference) <= set(model.state_dict())
    for name, tensor in reference.items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
