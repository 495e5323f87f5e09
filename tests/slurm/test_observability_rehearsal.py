"""The observability rehearsal: Debian's Prometheus and node exporter beside the local Slurm. A Slurm job
logs training steps through the engines' real MetricsLogger into node exporter's textfile folder, the
controller's Slurm collector (lifecycle/slurm_metrics.py) writes beside it, and Prometheus scrapes node
exporter every second. The PromQL HTTP API must show the run's loss, tokens/s and step with the run and
job labels during and after the job, node metrics and the Slurm series; every dashboard query evaluates."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hpctl.cli import main
from tools import dashboard_chart

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
    logger.on_log(args, state, None, logs=logs)
time.sleep(3)
PY
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[dict]:
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not (found := self.query(expr)):
            assert time.monotonic() < deadline, f"no series for {expr}"
            time.sleep(0.5)
        return found


@pytest.fixture(scope="module")
def stack(one_node, tmp_path_factory):
    for tool in ("prometheus", "prometheus-node-exporter"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: tools/system_packages.sh installs it (apt-get)", pytrace=False)
    base = tmp_path_factory.mktemp("observability")
    textfile = base / "textfile"
    textfile.mkdir()
    exporter_port, prometheus_port = free_port(), free_port()
    (base / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  external_labels:\n    cluster: rehearsal\n"
        f"scrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    processes = [
        subprocess.Popen(
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{exporter_port}",
             f"--collector.textfile.directory={textfile}", "--no-collector.infiniband"],
            stdout=subprocess.DEVNULL, stderr=(base / "node-exporter.log").open("w"),
        ),
        subprocess.Popen(
            ["prometheus", f"--config.file={base / 'prometheus.yml'}", f"--storage.tsdb.path={base / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            stdout=subprocess.DEVNULL, stderr=(base / "prometheus.log").open("w"),
        ),
    ]  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{exporter_port}/metrics")
        wait_http(f"http://127.0.0.1:{prometheus_port}/-/ready")
        yield one_node, Prometheus(f"http://127.0.0.1:{prometheus_port}"), textfile, base
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=20)


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
    prometheus.wait_for('hpl_slurm_nodes{state="idle"} == 1')
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
    remote_only = {"GPU utilisation of the run's jobs", "NeuronCore utilisation", "EFA receive bytes/s"}
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
