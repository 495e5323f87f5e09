"""Every GPU example run config rehearsed at tiny shape under one real local Slurm (tools/rehearse.py --tiny,
`make rehearse CONFIG=...`): all chains are submitted together and Slurm schedules them; each completes every
step with the example's own method, strategy and optimizer, and writes its adapter and merged model
(slurm_helpers.example_trained). The example the newcomer journey rehearses to the end with the user's records
(slurm_helpers.JOURNEY_EXAMPLE) is asserted there, on that chain, and not run again here.

The chains run without the smoke stage (--no-smoke): it is the same stage for any config and
the newcomer journey's `make rehearse` (tests/docs/test_newcomer_journey.py) and the trn2 rehearsal run it; here
the examples' own keys are what is tested."""

from __future__ import annotations

import subprocess
import sys

import pytest
from slurm_helpers import JOURNEY_EXAMPLE, REPO, RUN_STEPS, example_trained

from llm_pipeline import config
from llm_pipeline.run_files import SubmittedLine
from tools.rehearse import GPU_EXAMPLES, fsx_environment, tiny_shape_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-gpu_examples_rehearsal")]
CONFIGS = REPO / "payloads" / "configs"
CHAIN_TIMEOUT_S = 1800  # only stops a hung chain; asserts nothing about speed


def test_every_gpu_example_runs_its_chain_at_tiny_shape(two_nodes, tmp_path):
    assert JOURNEY_EXAMPLE in GPU_EXAMPLES  # the one left to the journey is still an example
    fsx = tmp_path / "fsx"
    env = two_nodes.env(fsx_environment(fsx))
    examples = sorted(set(GPU_EXAMPLES) - {JOURNEY_EXAMPLE})
    paths = {name: tiny_shape_config(CONFIGS / name, fsx, tmp_path) for name in examples}
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
        assert chains[name].returncode == 0, f"{name}:\n{out}"
        assert set(SubmittedLine.jobs(out)) == set(RUN_STEPS), name  # no smoke stage
        example_trained(name, out, configs[name].paths)
    qlora = configs["llama3-8b-qlora-g5.toml"].paths
    merged_qlora = next(qlora.logs_dir.glob("merge-*.log")).read_text()
    assert "quantized to 4-bit and dequantized first" in merged_qlora  # the adapter was trained on an NF4 base
