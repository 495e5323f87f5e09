"""One replica rule (config.data_parallel_size) wherever a run's steps are counted: the torch engine runs a
replica per process whatever tensor_parallel_size says, so a torch config on 8 devices with TP left at its
default of 8 is 8 replicas in the data step's report, in the estimate built on it, and in the sweep's plan;
and an epochs-based block-mode run is estimated from the data step's block count."""

from __future__ import annotations

import math

import pytest
from payload_configs import write_config
from test_estimate import smoke_run

from llm_pipeline import config, data
from llm_pipeline.jobs import estimate, partitions
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.jobs.sweep_plan import plan_sweep, read_base
from llm_pipeline.run_files import DATA_STATS_FILE, DataStats

EIGHT_TORCH_DEVICES = {"devices_per_node": 8, "tensor_parallel_size": config.ParallelConfig().tensor_parallel_size}


def test_an_epochs_based_block_mode_run_is_estimated_on_8_torch_replicas(capsys, tmp_path, hpl_env):
    path = write_config(
        tmp_path / "blocks.toml",
        hpl_env,
        data={"blocks": True, "packing": False},
        parallel=EIGHT_TORCH_DEVICES,
        train={"max_steps": -1, "epochs": 2.0},
    )
    cfg = config.load(path, env=hpl_env)
    stats = DataStats.from_json((data.prepare(cfg) / DATA_STATS_FILE).read_text())
    blocks = stats.trained
    per_epoch = math.ceil(blocks.sequences / (8 * cfg.train.per_device_batch_size))
    assert (stats.mode, blocks.replicas, blocks.optimizer_steps_per_epoch) == ("blocks", 8, per_epoch)
    # the smoke stage's logs in the same run folder, then the estimate's epochs-based step count
    run, _ = smoke_run(capsys, tmp_path, "")
    (run / "data").symlink_to(cfg.paths.data_dir, target_is_directory=True)
    train = estimate.estimate(run, path).steps[0]
    assert f"{2 * per_epoch} steps (train.epochs 2 x {per_epoch} steps per epoch on 8 data-parallel" in train.basis


def test_the_sweep_plans_8_torch_replicas(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        f'[paths]\noutput_dir = "{tmp_path / "run"}"\n[parallel]\ndevices_per_node = 8\n[train]\nbackend = "torch"\n'
    )
    facts = read_run_facts(path, {})
    assert read_base(facts.run, "torch").data_parallel == 8
    points = plan_sweep(facts, "torch", tmp_path / "sweep", [1, 3], steps=4, logging_steps=1)
    # per-device batch 1 x 8 replicas x gradient accumulation 3, held at 3 nodes by accumulation 1
    assert [(p.nodes, p.gradient_accumulation_steps, p.global_batch) for p in points] == [(1, 3, 24), (3, 1, 24)]


@pytest.mark.parametrize(
    ("backend", "env", "resolved"),
    [
        ("auto", {"HPL_ACCELERATOR": "neuron", "HPL_IMAGE_FAMILY": "neuron"}, "neuron"),  # trn1
        ("auto", {"HPL_ACCELERATOR": "neuron", "HPL_IMAGE_FAMILY": "torchneuron"}, "torch"),  # trn2
        ("auto", {"HPL_ACCELERATOR": "cuda"}, "torch"),
        ("auto", {}, "torch"),  # a local Slurm: the CPU
        ("neuron", {}, "neuron"),
    ],
)
def test_the_controller_resolves_auto_from_the_partition(backend, env, resolved):
    assert partitions.backend_on(backend, env) == resolved
