"""The Trainium2 LoRA config's pipeline shape under a real local Slurm, on this host's CPU
(tools/rehearse.py --trn2): the torch engine with FSDP2 over two ranks, the trn2 partition's job
environment (TorchNeuron's compile cache on the shared folder), no torch-xla precompile tool anywhere in
the chain, and every step of the long run completes.

The chain runs without its smoke stage (--no-smoke): the default chain's smoke stage runs in the newcomer
journey (tests/docs/test_newcomer_journey.py) and FSDP2's resume in tests/slurm/test_fsdp_train.py (LoRA) and
tests/jobs/test_job_rehearsal.py (two hosts); what the smoke stage adds for trn2, its training jobs on the long
run's compile cache, comes from the submission's own job exports run through env.sh (no job needed)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import LONG_STEPS, REPO, RUN_STEPS, SMOKE_JOBS, job_lines, submit

from llm_pipeline import config
from llm_pipeline.jobs import smoke
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from llm_pipeline.submit import SHARED_STEPS
from llm_pipeline.training import device
from tools.rehearse import FSX_VARIABLES, TRN2_RANKS, fsx_environment, trn2_environment, trn2_shape_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-trn2_rehearsal")]
TRAINING_JOBS = ("smoke-precompile", "smoke-train", "smoke-train-resume", "precompile", "train")
LONG_TRAINING_JOBS = tuple(step for step in TRAINING_JOBS if not smoke.is_smoke(step))


def cache_line(fsx: Path) -> str:
    return f"== TorchNeuron compile cache {fsx}/neuron-cache/torchneuron "


def test_trn2_config_shape_keeps_what_the_neuron_device_needs(tmp_path):
    cfg = config.load(trn2_shape_config(tmp_path / "fsx", tmp_path), env={k: str(tmp_path) for k in FSX_VARIABLES})
    assert (cfg.train.backend, cfg.parallel.strategy, cfg.parallel.devices_per_node) == ("torch", "fsdp", TRN2_RANKS)
    assert cfg.train.global_batch_size == TRN2_RANKS and cfg.model.id == "tiny-random-llama"
    assert (cfg.lora.r, cfg.lora.target_modules) == (16, ("q_proj", "v_proj"))  # the trn2 config's adapter
    assert device.refused_levers(cfg, device.NEURON) == []  # fixed-shape batches: no packing, no CUDA levers
    assert device.shape_arguments(cfg.data.max_length, device.NEURON) == {
        "pad_to_multiple_of": 128,
        "dataloader_drop_last": True,
    }


def test_trn2_smoke_stage_trains_on_the_long_runs_compile_cache(tmp_path):
    """The trn2 chain with its smoke stage, as submit would send it: its shape (a saving and a resumed smoke
    train), no torch-xla tool in any job, and every training job, smoke or long, given by env.sh (with that job's
    own exports) the one TorchNeuron compile cache folder, so the smoke run's graphs serve the long run."""
    fsx = tmp_path / "fsx"
    env = trn2_environment(fsx_environment(fsx, {"PATH": "/usr/bin:/bin"}))
    path = trn2_shape_config(fsx, tmp_path)
    result = submit(env, path, "--dry-run")
    assert result.returncode == 0, result.stderr
    sbatch = {
        re.search(r"--job-name=hpl-(\S+)", line).group(1): shlex.split(line.split("=$(", 1)[1].rstrip(")"))
        for line in job_lines(result.stdout)
    }
    assert list(sbatch) == [*SHARED_STEPS, *SMOKE_JOBS, smoke.ESTIMATE_STEP, *LONG_STEPS]
    assert not [step for step, words in sbatch.items() if "neuron_parallel_compile" in " ".join(words)]

    smoke.write_smoke_run(read_run_facts(path, env))  # what submit writes before the smoke jobs
    for step in TRAINING_JOBS:
        words = sbatch[step]
        script = Path(words[-1])
        assert script.name == f"{smoke.long_step(step)}.sbatch", words
        exports = dict(
            item.split("=", 1) for item in next(w for w in words if w.startswith("--export=")).split(",")[1:]
        )
        job_env = {**env, **exports}  # --export=ALL: the submitting environment and the job's own variables
        sourced = f'source "$HPL_PAYLOADS_DIR/slurm/env.sh" {script.stem}'
        out = subprocess.run(["bash", "-c", sourced], env=job_env, capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert cache_line(fsx) in out.stdout, (step, out.stdout)


def test_trn2_pipeline_shape_runs_on_cpu_without_the_xla_tool(one_node, tmp_path):
    fsx = tmp_path / "fsx"
    env = trn2_environment(one_node.env(fsx_environment(fsx)))
    path = trn2_shape_config(fsx, tmp_path)
    write_inputs(path, env, records=60)

    result = submit(env, path, "--no-smoke", "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pipeline: COMPLETED" in result.stdout
    jobs = SubmittedLine.jobs(result.stdout)
    assert list(jobs) == list(RUN_STEPS)

    out_dir = Path(config.load(path, env=env).paths.output_dir)
    logs = {}
    for step, job in jobs.items():
        logs[step] = (out_dir / "logs" / f"{step}-{job}.log").read_text()
        assert f"== {step}: COMPLETED (exit 0)" in logs[step]
    assert not [step for step, log in logs.items() if "neuron_parallel_compile" in log]
    assert "nothing to do" in logs["precompile"]  # no ahead-of-time step: TorchNeuron compiles as steps run
    assert [step for step in LONG_TRAINING_JOBS if cache_line(fsx) in logs[step]] == list(LONG_TRAINING_JOBS)
    assert f"--nproc_per_node={TRN2_RANKS}" in logs["train"] and f"{TRN2_RANKS} process(es), FSDP2" in logs["train"]
    assert [(line.step, line.total) for line in ProgressLine.parse_all(logs["train"])][-1] == (6, 6)
    assert (out_dir / "adapter" / "adapter_model.safetensors").is_file()
