"""The health gate on the local Slurm (jobs/health.py, env.sh's hpl_health_gate): the chain's train step checks its
node first. Stand-ins on PATH play the GPU tools (nvidia-smi, dcgmi, nccl-tests' all_reduce_perf); the first node
the gate checks fails nvidia-smi. The gate drains that node with its reason, requeues the step without it, and
the step passes the gate on the other node and trains there."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from slurm_helpers import REPO, submit, wait_for

from llm_pipeline.jobs import health
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import StepMarker, SubmittedLine
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-health")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"

# The first node whose nvidia-smi runs claims the bad-node file: that node is the broken one from then on.
NVIDIA_SMI = """\
#!/bin/bash
bad="$HEALTH_STANDIN_DIR/bad-node"
[[ -e "$bad" ]] || echo "$SLURMD_NODENAME" >"$bad"
if [[ "$(cat "$bad")" == "$SLURMD_NODENAME" ]]; then
  echo "Unable to determine the device handle for GPU0000:53:00.0: Unknown Error"
  exit 255
fi
echo "0, NVIDIA H100 80GB HBM3, 81559, 0"
"""
DCGMI = """\
#!/bin/bash
echo "| Denylist                  | Pass                                           |"
echo "| NVML Library              | Pass                                           |"
"""
ALL_REDUCE_PERF = """\
#!/bin/bash
echo "# Out of bounds values : 0 OK"
echo "# Avg bus bandwidth    : 1.5"
"""


def standins(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("nvidia-smi", NVIDIA_SMI), ("dcgmi", DCGMI), ("all_reduce_perf", ALL_REDUCE_PERF)):
        (bin_dir / name).write_text(textwrap.dedent(text))
        (bin_dir / name).chmod(0o755)
    return bin_dir


def node_reason(env: dict[str, str], node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t|%E"], env=env, capture_output=True, text=True)
    return out.stdout.splitlines()[0] if out.stdout else ""


def test_a_failing_check_drains_its_node_and_the_train_step_runs_on_the_other(two_nodes, tmp_path):
    standin_dir = tmp_path / "standins"
    env = two_nodes.env(fsx_environment(tmp_path / "fsx"))
    env.update(
        PATH=f"{standins(standin_dir)}:{env['PATH']}",
        HEALTH_STANDIN_DIR=str(standin_dir),
        HPL_HEALTH_GATE="1",  # the gate runs by itself on HyperPod only
        HPL_ACCELERATOR="cuda",
    )
    write_inputs(TINY, env, records=40)
    config = write_derived(TINY, tmp_path / "gate.toml", {("train", "max_steps"): 2}, run_dir="${HPL_OUTPUTS_DIR}/gate")
    out_dir = Path(env["HPL_OUTPUTS_DIR"]) / "gate"
    unknown = write_derived(TINY, tmp_path / "unknown.toml", {("train", "health_skip"): ["dcgm"]}, run_dir=out_dir)
    refused = submit(env, unknown, "--from", "data", "--no-smoke")  # skipping is by known name only
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: ") and "train.health_skip: invalid value 'dcgm'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    sent = submit(env, config, "--from", "data", "--to", "train", "--no-smoke")  # the steps after train: not needed
    assert sent.returncode == 0, sent.stderr
    sent_jobs = SubmittedLine.jobs(sent.stdout)
    train_job = sent_jobs["train"]
    assert list(sent_jobs)[-1] == "train", sent.stdout
    train_marker = out_dir / "logs" / "state" / "train.json"
    try:
        wait_for(
            lambda: train_marker.is_file() and StepMarker.from_json(train_marker.read_text()).state == "COMPLETED",
            300,
            "the train step to complete",
        )
    finally:
        subprocess.run(["scancel", "-p", two_nodes.name], env=env, check=False)  # nothing left behind

    bad = (standin_dir / "bad-node").read_text().strip()
    good = next(node for node in two_nodes.node_names if node != bad)
    state, reason = node_reason(env, bad).split("|", 1)
    assert state == "drain"
    assert reason.startswith("HealthCheck:Failed nvidia-smi: exit 255: Unable to determine the device handle")
    assert reason.endswith(f"({health.CHECKS_VERSION})")

    log = (out_dir / "logs" / f"train-{train_job}.log").read_text()
    assert f"== health gate: job {train_job} requeued without {bad}" in log
    assert f"== health gate: {good} HealthCheck:Passed ({health.CHECKS_VERSION})" in log
    starts = [line for line in log.splitlines() if line.startswith(f"== train: job {train_job} on ")]
    assert [line.split()[5] for line in starts] == [bad, good]  # requeued onto the healthy node
    assert not list((out_dir / "logs").glob("consolidate-*.log"))  # never submitted
    lines = [json.loads(line) for line in (out_dir / "logs" / health.RESULTS_FILE).read_text().splitlines()]
    assert [(line["node"], line["passed"]) for line in lines] == [(bad, False), (good, True)]
    assert all(line["version"] == health.CHECKS_VERSION and line["step"] == "train" for line in lines)
    assert {c["name"] for c in lines[1]["checks"]} == {"nvidia-smi", "dcgm-diag"}
