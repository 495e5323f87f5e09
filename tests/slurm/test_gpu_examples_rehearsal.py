"""Every GPU example run config rehearsed at tiny shape under one real local Slurm (tools/rehearse.py --tiny,
`make rehearse CONFIG=...`): all chains are submitted together and Slurm schedules them; each completes every
step with the example's own method, strategy and optimizer, and writes its adapter and merged model.

The chains run without the smoke stage (--no-smoke): it is the same stage for any config and
the newcomer journey's `make rehearse` (tests/docs/test_newcomer_journey.py) and the trn2 rehearsal run it; here
the examples' own keys are what is tested."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from slurm_helpers import REPO, RUN_STEPS

from llm_pipeline import config
from llm_pipeline.run_files import ProgressLine, SubmittedLine
from tools.rehearse import GPU_EXAMPLES, TINY_SHAPE, fsx_environment, tiny_shape_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-gpu_examples_rehearsal")]
CONFIGS = REPO / "payloads" / "configs"
CHAIN_TIMEOUT_S = 1800  # only stops a hung chain; asserts nothing about speed


def test_every_gpu_example_runs_its_chain_at_tiny_shape(two_nodes, tmp_path):
    fsx = tmp_path / "fsx"
    env = two_nodes.env(fsx_environment(fsx))
    paths = {name: tiny_shape_config(CONFIGS / name, fsx, tmp_path) for name in sorted(GPU_EXAMPLES)}
    configs = {name: config.load(path, env=env) for name, path in paths.items()}
    assert len({(cfg.paths.model_dir, cfg.model.dtype) for cfg in configs.values()}) == 1  # one tiny model serves all
    write_inputs(next(iter(paths.values())), env)

    command = [sys.executable, "-m", "llm_pipeline.submit", "--no-smoke", "--wait", "--poll", "2", "--config"]
    chains = {
        name: subprocess.Popen(
            [*command, str(path)], env=env, cwd=REPO / "payloads", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for name, path in paths.items()
    }
    outputs = {name: chain.communicate(timeout=CHAIN_TIMEOUT_S)[0].decode() for name, chain in chains.items()}

    for name, out in outputs.items():
        assert chains[name].returncode == 0 and "pipeline: COMPLETED" in out, f"{name}:\n{out}"
        own, run = config.load(CONFIGS / name, env={}), configs[name].paths
        jobs = SubmittedLine.jobs(out)
        assert set(jobs) == set(RUN_STEPS), name
        logs = {step: (run.logs_dir / f"{step}-{job}.log").read_text() for step, job in jobs.items()}
        assert [step for step in RUN_STEPS if f"== {step}: COMPLETED (exit 0)" in logs[step]] == list(RUN_STEPS), name
        train = own.train
        # What trained is the example's own configuration (read back from the steps' logs), at tiny shape.
        assert f"backend torch: method {train.method}, strategy {own.parallel.strategy}" in logs["prepare"], name
        assert f"lr_scheduler {train.lr_scheduler}, optimizer {train.optimizer}: known" in logs["prepare"], name
        assert f"packing is {'on' if own.data.packing else 'off'} (data.packing)" in logs["data"], name
        trained = rf"(?m)^method {train.method}: [\d,]+ trainable parameters \(as expected\); 1 process"
        assert re.search(trained, logs["train"]), name
        assert f"gradient checkpointing {train.gradient_checkpointing}; " in logs["train"], name
        steps = TINY_SHAPE["train", "max_steps"]
        assert [(line.step, line.total) for line in ProgressLine.parse_all(logs["train"])][-1] == (steps, steps)
        assert (run.adapter_dir / "adapter_model.safetensors").is_file(), name
        assert {"config.json", "model.safetensors"} <= {path.name for path in run.merged_dir.iterdir()}, name
        assert "### Answer" in run.generation_file.read_text() and (run.eval_dir / "report.md").is_file(), name
    qlora = configs["llama3-8b-qlora-g5.toml"].paths
    merged_qlora = next(qlora.logs_dir.glob("merge-*.log")).read_text()
    assert "quantized to 4-bit and dequantized first" in merged_qlora  # the adapter was trained on an NF4 base
