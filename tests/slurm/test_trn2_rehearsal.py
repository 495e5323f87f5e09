"""The Trainium2 LoRA config's pipeline shape under a real local Slurm, on this host's CPU
(tools/rehearse.py --trn2): the torch engine with FSDP2 over two ranks, the trn2 partition's job
environment (TorchNeuron's compile cache on the shared folder), no torch-xla precompile tool anywhere in
the chain, and every step of the smoke stage and the long run completes; `submit status` then reports the
finished chain with its smoke stage and the smoke run's estimate (full fine-tuning's chain runs --no-smoke and
relies on this)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from slurm_helpers import RUN_STEPS, submit

from llm_pipeline import config
from llm_pipeline.jobs import smoke
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from llm_pipeline.submit import SHARED_STEPS
from llm_pipeline.training import device
from tools.rehearse import FSX_VARIABLES, TRN2_RANKS, fsx_environment, trn2_environment, trn2_shape_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-trn2_rehearsal")]
TRAINING_JOBS = ("smoke-precompile", "smoke-train", "smoke-train-resume", "precompile", "train")


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


def test_trn2_pipeline_shape_runs_on_cpu_without_the_xla_tool(one_node, tmp_path):
    fsx = tmp_path / "fsx"
    env = trn2_environment(one_node.env(fsx_environment(fsx)))
    path = trn2_shape_config(fsx, tmp_path)
    write_inputs(path, env, records=60)

    result = submit(env, path, "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pipeline: COMPLETED" in result.stdout
    jobs = SubmittedLine.jobs(result.stdout)
    long_steps = [step for step in RUN_STEPS if step not in SHARED_STEPS]
    assert set(jobs) >= {*SHARED_STEPS, *long_steps, "smoke-train", "smoke-train-resume", "estimate"}

    out_dir = config.load(path, env=env).paths.output_dir
    logs = {}
    for step, job in jobs.items():
        folder = Path(out_dir) / smoke.SMOKE_FOLDER if smoke.is_smoke(step) else Path(out_dir)
        logs[step] = (folder / "logs" / f"{step}-{job}.log").read_text()
        assert f"== {step}: COMPLETED (exit 0)" in logs[step]
    assert not [step for step, log in logs.items() if "neuron_parallel_compile" in log]
    assert "nothing to do" in logs["precompile"]  # no ahead-of-time step: TorchNeuron compiles as steps run
    cache = f"== TorchNeuron compile cache {fsx}/neuron-cache/torchneuron "
    assert [step for step in TRAINING_JOBS if cache in logs[step]] == list(TRAINING_JOBS)  # one folder for all
    assert f"--nproc_per_node={TRN2_RANKS}" in logs["train"] and f"{TRN2_RANKS} process(es), FSDP2" in logs["train"]
    assert [(line.step, line.total) for line in ProgressLine.parse_all(logs["train"])][-1] == (6, 6)
    assert (Path(out_dir) / "adapter" / "adapter_model.safetensors").is_file()
    # status on a finished chain with its smoke stage: every step completed, and the smoke run's estimate (the
    # default chain's are the newcomer journey's first `make rehearse`; its Slurm stops with it)
    status = submit(env, path, "status")
    assert status.returncode == 0 and "pipeline: COMPLETED" in status.stdout, status.stdout + status.stderr
    assert re.search(rf"(?m)^smoke-train-resume +{jobs['smoke-train-resume']} +COMPLETED", status.stdout), status.stdout
    assert "estimate from the smoke run" in status.stdout
