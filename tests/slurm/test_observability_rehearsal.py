"""The observability rehearsal: Debian's Prometheus and node exporter beside the local Slurm. A Slurm job
logs training steps through the engines' real MetricsLogger into node exporter's textfile folder, the
controller's Slurm collector (lifecycle/slurm_metrics.py) writes beside it, and Prometheus scrapes node
exporter every second. The PromQL HTTP API must show the run's loss, tokens/s and step with the run and
job labels during and after the job, node metrics and the Slurm series; every dashboard query evaluates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctl.cli import main
from tools import dashboard_chart
from tools.local_prometheus import LocalPrometheus, LocalPrometheusError, sweep_once

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "dashboards" / "cluster-and-run.json"
RUN = "rehearsal-run"
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-observability")]

# A training step as the pipeline logs it: the real callback, one log event per second, 8 steps.
JOB = f"""#!/bin/bash
#SBATCH --job-name=observability --nodes=1 --ntasks=1
exec {sys.executable} - <<'PY'
import time
from transformers import TrainerState, TrainingArguments
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter
args = TrainingArguments(output_dir="{{run_dir}}/checkpoints", per_device_train_batch_size=2, report_to="none")
state = TrainerState(max_steps=8, is_world_process_zero=True)
tokens = TokenCounter(lambda features: features)
logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
logger.on_train_begin(args, state, None)
for step in range(1, 9):
    time.sleep(1.0)
    tokens.real += 2048
    state.global_step = step
    logs = {{"loss": 3.0 / step, "learning_rate": 1e-4 * (9 - step) / 8, "mfu": 0.3}}  # mfu: as the engines add it
    # as trl's GRPOTrainer logs them, so the dashboard's GRPO panels have a run to show
    logs |= {{"reward": step / 8, "kl": 0.01 * step, "completions/mean_length": 12.0, "rewards/format/mean": step / 8}}
    logger.on_log(args, state, None, logs=logs)
time.sleep(3)
PY
"""


@pytest.fixture(scope="module")
def stack(one_node, tmp_path_factory):
    base = tmp_path_factory.mktemp("observability")
    try:
        with LocalPrometheus(base / "prometheus") as prometheus:
            yield one_node, prometheus, prometheus.textfile, base
    except LocalPrometheusError as error:
        pytest.fail(str(error), pytrace=False)


def slurm_metrics(slurm, textfile: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "lifecycle" / "slurm_metrics.py"), "cluster", str(textfile)],
        env=slurm.env(), check=True, timeout=30,
    )  # fmt: skip


def test_the_run_the_nodes_and_slurm_in_prometheus(stack):
    slurm, prometheus, textfile, base = stack
    script = base / "observability.sbatch"
    script.write_text(JOB.replace("{run_dir}", str(base / "runs" / RUN)))
    started = time.time()
    slurm_metrics(slurm, textfile)  # before the job: an idle node, no job
    env = slurm.env({**os.environ, "HPL_METRICS_TEXTFILE_PATH": str(textfile), "PYTHONPATH": f"{ROOT / 'payloads'}"})
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={base / 'job.log'}", str(script)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]

    # During the run: the job is running in Slurm and its steps arrive with both labels.
    during = prometheus.wait_for(f'hpl_train_step{{run="{RUN}",slurm_job_id="{job_id}"}} >= 2', timeout=90)
    assert during[0]["metric"]["job"] == "node"  # scraped from node exporter's textfile collector
    sweep_once(textfile, slurm.env(), slurm.node_names[0])  # the node's sweep vouches for the running job
    slurm_metrics(slurm, textfile)
    prometheus.wait_for('sum(hpl_slurm_jobs{state="running"}) >= 1')

    deadline = time.monotonic() + 90
    while slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        assert time.monotonic() < deadline, "the rehearsal job did not finish"
        time.sleep(1)
    assert "step 8/8 | loss 0.3750" in (base / "job.log").read_text()
    slurm_metrics(slurm, textfile)

    # After the run: the last figures, node metrics, and Slurm with an idle node and no running job.
    labels = f'{{run="{RUN}",slurm_job_id="{job_id}"}}'
    prometheus.wait_for(f"hpl_train_step{labels} == 8")
    (loss,) = prometheus.query(f"hpl_train_loss{labels}")
    assert float(loss["value"][1]) == pytest.approx(0.375)
    (tokens,) = prometheus.query(f"hpl_train_tokens_per_second{labels}")
    assert 1000 < float(tokens["value"][1]) < 4096  # 2048 tokens per step, about a second apart
    assert prometheus.query("node_memory_MemAvailable_bytes") and prometheus.query("node_cpu_seconds_total")
    prometheus.wait_for(f'hpl_slurm_nodes{{state="idle"}} == {len(slurm.slurm.node_names)}')  # the whole cluster's
    assert prometheus.query("hpl_slurm_up == 1")
    prometheus.wait_for('sum(hpl_slurm_jobs{state="running"}) == 0')

    # The picture of the dashboard: every drawn panel has this run's data, on one PNG.
    chart = base / "dashboard.png"
    drawn = dashboard_chart.draw(prometheus.url, started, time.time(), chart, run=RUN, job=job_id)
    assert set(drawn) == set(dashboard_chart.PANELS) and all(drawn.values()), drawn
    assert chart.read_bytes().startswith(b"\x89PNG") and chart.stat().st_size > 20_000


def test_every_dashboard_query_evaluates_and_the_local_ones_return_data(stack):
    _, prometheus, _, _ = stack
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {panel["title"]: target["expr"] for panel in dashboard["panels"] for target in panel["targets"]}
    # Series no local machine has: GPUs, NeuronCores, EFA devices.
    remote_only = {
        "GPU utilisation of the run's jobs",
        "NeuronCore utilisation of the job's nodes",
        "EFA receive bytes/s",
    }
    assert remote_only < set(exprs)
    prometheus.wait_for("hpl_train_step")
    for title, expr in exprs.items():
        result = prometheus.query(expr.replace("$run", ".*").replace("$job", ".*"))  # Grafana's "All"
        assert bool(result) != (title in remote_only), f"{title}: {expr} -> {result}"


def test_hpctl_metrics_reads_the_run_from_this_prometheus(stack, capsys):
    _, prometheus, _, _ = stack
    prometheus.wait_for(f'hpl_train_step{{run="{RUN}"}} == 8')
    assert main(["metrics", RUN, "--endpoint", prometheus.url, "--unsigned"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"run {RUN}  (Slurm job ")
    assert lines[1:4] == ["  step          8 / 8", "  loss          0.3750", "  learning rate 1.25e-05"]
    assert lines[5:] == ["  MFU           30.0%", "  ETA           0:00:00"]
