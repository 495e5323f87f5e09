"""The dashboard's device panels joined to a Slurm job, evaluated by a real Prometheus: NeuronCore utilisation of
the nodes the sweep saw the job on (hpl_job_heartbeat_timestamp_seconds carries the node, as the agent's external
label does on a cluster), and no other node's."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tools.local_prometheus import LocalPrometheus

DASHBOARD = Path(__file__).resolve().parents[2] / "observability" / "dashboards" / "cluster-and-run.json"


def panel_expr(title: str) -> str:
    panels = {panel["title"]: panel for panel in json.loads(DASHBOARD.read_text())["panels"]}
    (target,) = panels[title]["targets"]
    return target["expr"]


def test_neuroncore_utilisation_is_shown_for_the_jobs_nodes_only(tmp_path):
    now = time.time()
    with LocalPrometheus(tmp_path / "prometheus") as prometheus:
        (prometheus.textfile / "devices.prom").write_text(
            "".join(
                f'neuroncore_utilization_ratio{{node="{node}",neuroncore="{core}"}} {value}\n'
                for node, value in (("trn1-1", 0.8), ("trn1-2", 0.6), ("trn1-3", 0.1))
                for core in (0, 1)
            )
            + f'hpl_job_heartbeat_timestamp_seconds{{node="trn1-1",slurm_job_id="7"}} {now}\n'
            + f'hpl_job_heartbeat_timestamp_seconds{{node="trn1-2",slurm_job_id="7"}} {now}\n'
            + f'hpl_job_heartbeat_timestamp_seconds{{node="trn1-3",slurm_job_id="9"}} {now}\n'
        )
        expr = panel_expr("NeuronCore utilisation of the job's nodes")
        shown = prometheus.wait_for(expr.replace("$job", "7"))
        assert sorted((s["metric"]["node"], float(s["value"][1])) for s in shown) == [("trn1-1", 0.8), ("trn1-2", 0.6)]
        (other,) = prometheus.query(expr.replace("$job", "9"))
        assert other["metric"]["node"] == "trn1-3"
