"""A run's series end with its job, against Debian's Prometheus and node exporter beside a local Slurm whose epilog
is the lifecycle's (an Epilog folder glob, slurm_metrics.py epilog-script): the ended job's run metrics leave the
textfile folder and Prometheus stops answering for them within a minute; a job that ended without its epilog is
swept by the node's timer; and the dashboard's run panels drop a run whose node stopped vouching for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import require_slurm
from tools.local_prometheus import LocalPrometheus, epilog_conf, sweep_once
from tools.local_slurm import LocalSlurm

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "dashboards" / "cluster-and-run.json"
RUN = "series-end"
ENDED_WITHIN_S = 60
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-series-end")]

# The engines' publisher (stdlib only), three log events a second apart, then SECONDS more of "training".
JOB = f"""#!/bin/bash
#SBATCH --job-name=series-end --nodes=1 --ntasks=1
exec {sys.executable} - <<'PY'
import time
from llm_pipeline.jobs import prom_textfile
for step in range(1, 4):
    prom_textfile.publish_event({{"loss": 3.0 / step, "tokens_per_second": 1000.0}}, step=step, max_steps=3,
                                eta_seconds=3 - step, run="{RUN}")
    time.sleep(1)
time.sleep({{seconds}})
PY
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_slurm()
    base = tmp_path_factory.mktemp("series-end")
    with LocalPrometheus(base / "prometheus") as prometheus:
        conf = epilog_conf(prometheus, base / "epilog.d")
        with LocalSlurm(base / "slurm", extra_conf=conf) as slurm:
            yield slurm, prometheus, base


def submit(cluster, seconds: float) -> str:
    slurm, prometheus, base = cluster
    script = base / f"job-{seconds}.sbatch"
    script.write_text(JOB.replace("{seconds}", str(seconds)))
    env = slurm.env({**os.environ, "HPL_METRICS_TEXTFILE_PATH": str(prometheus.textfile),
                     "PYTHONPATH": str(ROOT / "payloads")})  # fmt: skip
    done = subprocess.run(
        ["sbatch", "--parsable", f"--output={base / 'job-%j.log'}", str(script)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def wait_gone_from_squeue(slurm, job_id: str) -> None:
    deadline = time.monotonic() + 90
    while slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} did not finish"
        time.sleep(0.5)


def run_panel(title: str) -> str:
    panels = {panel["title"]: panel for panel in json.loads(DASHBOARD.read_text())["panels"]}
    return panels[title]["targets"][0]["expr"].replace("$run", RUN)


def test_an_ended_jobs_series_are_gone_within_a_minute(cluster):
    slurm, prometheus, _ = cluster
    job_id = submit(cluster, seconds=1)
    loss = f'hpl_train_loss{{run="{RUN}",slurm_job_id="{job_id}"}}'
    prometheus.wait_for(loss, timeout=60)  # it reported while running
    wait_gone_from_squeue(slurm, job_id)
    ended = time.monotonic()
    prometheus.wait_until_empty(loss, timeout=ENDED_WITHIN_S)
    prometheus.wait_until_empty(f'hpl_train_step{{slurm_job_id="{job_id}"}}', timeout=1)
    assert time.monotonic() - ended < ENDED_WITHIN_S
    assert not list(prometheus.textfile.glob(f"hpl_run_{job_id}.prom"))  # the epilog removed it


def test_a_job_that_ended_without_its_epilog_is_swept_and_a_running_one_is_kept(cluster):
    slurm, prometheus, _ = cluster
    running = submit(cluster, seconds=40)
    prometheus.wait_for(f'hpl_train_step{{slurm_job_id="{running}"}} == 3', timeout=60)
    ended = "999999"  # a job Slurm no longer has, whose file the epilog never removed (slurmd killed, say)
    (prometheus.textfile / f"hpl_run_{ended}.prom").write_text(
        (prometheus.textfile / f"hpl_run_{running}.prom").read_text().replace(running, ended)
    )
    prometheus.wait_for(f'hpl_train_loss{{slurm_job_id="{ended}"}}')
    node = slurm.node_names[0]

    sweep_once(prometheus.textfile, slurm.env(), node)
    prometheus.wait_until_empty(f'hpl_train_loss{{slurm_job_id="{ended}"}}', timeout=ENDED_WITHIN_S)
    assert prometheus.query(f'hpl_train_loss{{slurm_job_id="{running}"}}')  # still on the node: kept
    # The dashboard shows the running job (the sweep vouches for it) ...
    prometheus.wait_for(f'hpl_job_heartbeat_timestamp_seconds{{slurm_job_id="{running}"}}')
    (shown,) = prometheus.wait_for(run_panel("Loss"))
    assert shown["metric"]["slurm_job_id"] == running and float(shown["value"][1]) == pytest.approx(1.0)
    # ... and marks it stale once the node stops vouching (a heartbeat a minute old: the sweep or Slurm is down).
    heartbeat = prometheus.textfile / "hpl_jobs.prom"
    old = f"{time.time() - 61:.3f}"
    heartbeat.write_text("\n".join(line.rsplit(" ", 1)[0] + f" {old}" if line.startswith("hpl_") else line
                                   for line in heartbeat.read_text().splitlines()) + "\n")  # fmt: skip
    prometheus.wait_until_empty(run_panel("Loss"), timeout=10)
    assert prometheus.query(f'hpl_train_loss{{slurm_job_id="{running}"}}')  # the raw series is still there

    slurm.run("scancel", running)
    wait_gone_from_squeue(slurm, running)
    prometheus.wait_until_empty(f'hpl_train_loss{{slurm_job_id="{running}"}}', timeout=ENDED_WITHIN_S)
