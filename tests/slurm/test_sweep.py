"""The scaling sweep under a real two-node local Slurm: the tiny torch-backend run at 1 and 2 nodes,
chained (data, the smoke stage, the estimate, precompile and train per node count, report), at one
global batch, reported as a table."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, read_png

from llm_pipeline import charts
from llm_pipeline.jobs import smoke
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import StepMarker, SubmittedLine
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-sweep")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


def sweep(env: dict[str, str], config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llm_pipeline.sweep", "--config", str(config), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "payloads", timeout=900)


@pytest.fixture(scope="module")
def setup(two_nodes, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    env = two_nodes.env(fsx_environment(root / "fsx"))
    # launch's default rendezvous port is 20000 + job id mod 12000, and every local cluster numbers its jobs from 1:
    # a free port keeps this test's two-node rendezvous away from other local clusters on this host.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        env["HPL_MASTER_PORT"] = str(probe.getsockname()[1])
    write_inputs(TINY, env, records=120)
    config = write_derived(
        TINY,
        root / "sweep.toml",
        {("train", "gradient_accumulation_steps"): 2},
        run_dir="${HPL_OUTPUTS_DIR}/tiny-sweep",
    )
    return env, config, Path(env["HPL_OUTPUTS_DIR"]) / "tiny-sweep" / "sweep"


def test_two_node_counts_keep_the_global_batch_and_are_reported(setup):
    env, config, sweep_dir = setup
    result = sweep(env, config, "--nodes", "1,2", "--steps", "3", "--logging-steps", "1", "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [(line.step, line.label.split("(")[1][0]) for line in SubmittedLine.all(result.stdout)]
    points = [("precompile", "1"), ("train", "1"), ("precompile", "2"), ("train", "2"), ("sweep_report", "1")]
    # The smoke stage first: every node count's path (launch on its nodes, train, the report), then the estimate.
    assert steps == [("data", "1"), *((f"smoke-{step}", n) for step, n in points), ("estimate", "1"), *points]
    report = json.loads((sweep_dir / "scaling.json").read_text())
    rows = {row["nodes"]: row for row in report["rows"]}
    assert [rows[n]["gradient_accumulation_steps"] for n in (1, 2)] == [2, 1]
    assert rows[1]["global_batch"] == rows[2]["global_batch"] == 8  # 4 per device x DP x GA
    assert all(row["backend"] == "torch" and row["sequences_per_second"] > 0 for row in rows.values())
    assert rows[1]["scaling_efficiency"] == 1.0 and rows[2]["reference_sequences_per_second"] is None
    train_2 = Path(rows[2]["log"]).read_text()
    assert "2 data-parallel replica(s)" in train_2 and "(2 node(s))" in train_2
    table = (sweep_dir / "scaling.md").read_text()
    read_png(sweep_dir / "scaling.png")  # drawn by the report job from scaling.json, whose figures it plots:
    (axis,) = charts.sweep_figure(report).axes
    measured = [(float(n), rows[n]["sequences_per_second"]) for n in (1, 2)]
    assert [tuple(p) for p in axis.lines[0].get_xydata()] == measured and axis.lines[0].get_label() == "measured"
    assert re.search(r"(?m)^\| 2 \| 1 \| 8 \| [0-9.]+ \| \d+ \|", table) and "smallest run is the baseline" in table
    derived = (sweep_dir / "nodes-2" / "run.toml").read_text()
    assert "nodes = 2" in derived and "gradient_accumulation_steps = 1" in derived and "max_steps = 3" in derived
    assert "save_checkpoints = false" in derived
    for nodes in (1, 2):  # a throughput point writes no checkpoint, not even at its last step
        assert not list((sweep_dir / f"nodes-{nodes}").glob("checkpoints/checkpoint-*"))

    # The smoke sweep: 4 steps at each node count on its own folders, reported like the real one.
    smoke_rows = json.loads((sweep_dir / "smoke" / "scaling.json").read_text())["rows"]
    assert [(row["nodes"], row["gradient_accumulation_steps"]) for row in smoke_rows] == [(1, 2), (2, 1)]
    smoke_2 = Path(smoke_rows[1]["log"])
    assert smoke_2.parent == sweep_dir / "smoke" / "nodes-2" / "logs" and smoke_2.name.startswith("smoke-train-")
    assert "step 4/4 | loss" in smoke_2.read_text() and "2 data-parallel replica(s)" in smoke_2.read_text()
    # The estimate, from each node count's smoke step time, before the first long point started.
    found = json.loads((sweep_dir / "logs" / "estimate.json").read_text())
    trains = [row for row in found["steps"] if row["step"] == "train"]
    assert [row["nodes"] for row in trains] == [1, 2] and set(found["seconds_per_step"]) == {"train@1", "train@2"}
    assert all("3 steps (train.max_steps)" in row["basis"] for row in trains)
    assert "estimate from the smoke run" in result.stdout
    estimated = StepMarker.from_json((sweep_dir / "logs" / "state" / "estimate.json").read_text()).time
    assert (
        estimated
        <= StepMarker.from_json((sweep_dir / "nodes-1" / "logs" / "state" / "precompile.json").read_text()).time
    )


def test_no_smoke_submits_the_long_points_only_and_says_what_that_risks(setup):
    env, config, _ = setup
    result = sweep(env, config, "--nodes", "1,2", "--no-smoke", "--dry-run")
    assert result.returncode == 0, result.stderr
    jobs = [job for job in re.findall(r"--job-name=hpl-(\S+)", result.stdout) if job != "data"]
    assert jobs == ["precompile", "train", "precompile", "train", "sweep_report"]
    assert f"note: {smoke.NO_SMOKE_RISK}" in result.stdout


def test_a_node_count_that_cannot_keep_the_batch_is_refused_before_submitting(setup):
    env, config, _ = setup
    result = sweep(env, config, "--nodes", "1,3", "--dry-run")
    assert result.returncode == 2
    assert "3 node(s) cannot keep the global batch of 8" in result.stderr
    assert "train.gradient_accumulation_steps" in result.stderr and "submitted" not in result.stdout
