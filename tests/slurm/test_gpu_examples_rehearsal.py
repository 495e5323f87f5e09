"""Every GPU example run config rehearsed at tiny shape under one real local Slurm (tools/rehearse.py --tiny,
`make rehearse CONFIG=...`): all chains are submitted together and Slurm schedules them; each completes every
step with the example's own method, strategy and optimizer, and writes its adapter and merged model
(slurm_helpers.example_trained). The example the newcomer journey rehearses to the end with the user's records
(slurm_helpers.JOURNEY_EXAMPLE) is asserted there, on that chain, and not run again here.

The chains run without the smoke stage (--no-smoke): it is the same stage for any config and
the newcomer journey's `make rehearse` (tests/docs/test_newcomer_journey.py) and the trn2 rehearsal run it; here
the examples' own keys are what is tested. They start at the data step (--from data): prepare's checks of each
example at tiny shape, with its method, strategy, scheduler and optimizer, run in process
(tests/payloads/test_run_configs.py), and the download step finds the tiny model in place, as in the journey.
Likewise, only the QLoRA chain (SHIPPED: evaluate scores its
adapter on the 4-bit base) generates and evaluates here: those steps read the [generate] and [eval] keys, which
every example shares, and a LoRA chain's are the journey's; the other chains are submitted `--to merge`."""

from __future__ import annotations

import pytest
from slurm_helpers import JOURNEY_EXAMPLE, REPO, RUN_STEPS, example_trained, submit, wait_for

from llm_pipeline import config
from llm_pipeline.run_files import SubmittedLine
from tools.rehearse import GPU_EXAMPLES, fsx_environment, tiny_shape_config, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-gpu_examples_rehearsal")]
CONFIGS = REPO / "payloads" / "configs"
CHAIN_TIMEOUT_S = 1800  # only stops a hung chain; asserts nothing about speed
FIRST = "data"  # each chain's first step (prepare's checks of the examples run in process)
SHIPPED = "llama3-8b-qlora-g5.toml"  # the one chain here to generate and evaluate (the others end after merge)


def test_every_gpu_example_runs_its_chain_at_tiny_shape(two_nodes, tmp_path):
    assert JOURNEY_EXAMPLE in GPU_EXAMPLES  # the one left to the journey is still an example
    fsx = tmp_path / "fsx"
    env = two_nodes.env(fsx_environment(fsx))
    examples = sorted(set(GPU_EXAMPLES) - {JOURNEY_EXAMPLE})
    paths = {name: tiny_shape_config(CONFIGS / name, fsx, tmp_path) for name in examples}
    configs = {name: config.load(path, env=env) for name, path in paths.items()}
    assert len({(cfg.paths.model_dir, cfg.model.dtype) for cfg in configs.values()}) == 1  # one tiny model serves all
    write_inputs(next(iter(paths.values())), env)

    last = {name: RUN_STEPS[-1] if name == SHIPPED else "merge" for name in paths}
    options = {name: ("--no-smoke", "--from", FIRST, "--to", last[name]) for name in paths}
    submitted = {name: submit(env, path, *options[name]) for name, path in paths.items()}
    for name, sent in submitted.items():
        assert sent.returncode == 0, f"{name}:\n{sent.stdout}{sent.stderr}"
    wait_for(
        lambda: not two_nodes.run("squeue", "-h", "-p", two_nodes.name).stdout.strip(),
        CHAIN_TIMEOUT_S,
        "the chains to end",
        poll=2,
    )

    for name, sent in submitted.items():
        status = submit(env, paths[name], "status")
        assert status.returncode == 0, f"{name}:\n{status.stdout}{status.stderr}"
        ran = RUN_STEPS[RUN_STEPS.index(FIRST) : RUN_STEPS.index(last[name]) + 1]
        assert set(SubmittedLine.jobs(sent.stdout)) == set(ran), name  # no smoke stage
        example_trained(name, sent.stdout + status.stdout, configs[name].paths, last[name], FIRST)
    qlora = configs[SHIPPED].paths
    merged_qlora = next(qlora.logs_dir.glob("merge-*.log")).read_text()
    assert "quantized to 4-bit and dequantized first" in merged_qlora  # the adapter was trained on an NF4 base
