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


def test_the_slurm_panels_read_slurm_25_11s_own_series_as_they_read_the_poll(tmp_path):
    """Where the agent scrapes slurmctld's /metrics/partitions instead of the poll's hpl_slurm_* series."""
    native = {  # Slurm 25.11's per-partition gauges (label partition)
        "slurm_partition_jobs_running": 3, "slurm_partition_jobs_pending": 2, "slurm_partition_jobs_cpus_alloc": 96,
        "slurm_partition_nodes_idle": 1, "slurm_partition_nodes_alloc": 3, "slurm_partition_nodes_mem_tot": 2048,
    }  # fmt: skip
    with LocalPrometheus(tmp_path / "prometheus") as prometheus:
        (prometheus.textfile / "slurmctld.prom").write_text(
            "".join(f'{name}{{partition="p5"}} {value}\n' for name, value in native.items())
        )
        for title, expected in (
            ("Slurm jobs by state", {"running": 3.0, "pending": 2.0}),
            ("Slurm nodes by state", {"idle": 1.0, "alloc": 3.0}),
        ):
            shown = prometheus.wait_for(panel_expr(title))
            assert {s["metric"]["state"]: float(s["value"][1]) for s in shown} == expected, title
            assert {s["metric"]["partition"] for s in shown} == {"p5"}
