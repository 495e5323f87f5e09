"""EFA's counters reach Prometheus: on a fake sysfs tree laid out as the efa driver lays it out (port counters only
under ports/<port>/hw_counters, no standard IB counters/ folder), node exporter's own infiniband collector gives no
byte series, while `slurm_metrics.py efa` (the lifecycle's hpl-efa-counters timer) puts every port counter into
the textfile folder; the dashboard's EFA panel evaluates on them in a real Prometheus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.local_prometheus import SLURM_METRICS, LocalPrometheus

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "dashboards" / "cluster-and-run.json"
DEVICES = ("rdmap16s27", "rdmap32s27")
# The efa driver's port counters (drivers/infiniband/hw/efa/efa_verbs.c, EFA_DEFINE_PORT_STATS and later additions).
PORT_COUNTERS = (
    "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
    "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes", "rdma_write_wrs",
    "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes", "retrans_pkts",
)  # fmt: skip
DEVICE_COUNTERS = ("submitted_cmds", "completed_cmds", "cmds_err", "keep_alive_rcvd")  # <device>/hw_counters


def write_efa_sysfs(sys_root: Path, scale: int) -> Path:
    """/sys/class/infiniband/<device>/ with port 1's state, rate and hw_counters; counter i is i * scale."""
    infiniband = sys_root / "class" / "infiniband"
    for device in DEVICES:
        port = infiniband / device / "ports" / "1"
        (port / "hw_counters").mkdir(parents=True, exist_ok=True)
        (infiniband / device / "hw_counters").mkdir(exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
        (port / "link_layer").write_text("Unspecified\n")
        for index, name in enumerate(PORT_COUNTERS, start=1):
            (port / "hw_counters" / name).write_text(f"{index * scale}\n")
        (port / "hw_counters" / "lifespan").write_text("12\n")  # the kernel's cache period: not a counter name
        for name in DEVICE_COUNTERS:
            (infiniband / device / "hw_counters" / name).write_text("7\n")
    return infiniband


def collect(textfile: Path, infiniband: Path) -> None:
    subprocess.run([sys.executable, str(SLURM_METRICS), "efa", str(textfile), str(infiniband)], check=True)


@pytest.fixture
def efa_node(tmp_path):
    sys_root = tmp_path / "sys"
    write_efa_sysfs(sys_root, scale=1000)
    args = ("--collector.infiniband", f"--path.sysfs={sys_root}")  # what the lifecycle used to turn on for EFA
    with LocalPrometheus(tmp_path / "prometheus", node_exporter_args=args) as prometheus:
        yield prometheus, sys_root


def test_every_efa_port_counter_becomes_a_series_and_the_panel_shows_the_rate(efa_node):
    prometheus, sys_root = efa_node
    infiniband = sys_root / "class" / "infiniband"
    collect(prometheus.textfile, infiniband)
    received = prometheus.wait_for("hpl_efa_rx_bytes_total")
    assert sorted((s["metric"]["device"], s["metric"]["port"], s["value"][1]) for s in received) == [
        (device, "1", str(PORT_COUNTERS.index("rx_bytes") * 1000 + 1000)) for device in DEVICES
    ]
    for counter in ("tx_bytes", "rx_pkts", "tx_pkts", "rdma_read_bytes", "rdma_write_bytes"):
        assert len(prometheus.query(f"hpl_efa_{counter}_total")) == len(DEVICES), counter
    assert not prometheus.query('{__name__=~"hpl_efa_(lifespan|submitted_cmds)_total"}')  # port counters only
    # node exporter's infiniband collector on the same tree: no EFA byte or packet series
    assert not prometheus.query('{__name__=~"node_infiniband_port_(data|packets)_.*"}')

    panels = {panel["title"]: panel for panel in json.loads(DASHBOARD.read_text())["panels"]}
    (panel_expr,) = [target["expr"] for target in panels["EFA receive bytes/s"]["targets"]]
    assert "hpl_efa_rx_bytes_total" in panel_expr
    write_efa_sysfs(sys_root, scale=5000)  # traffic
    collect(prometheus.textfile, infiniband)
    prometheus.wait_for(f"hpl_efa_rx_bytes_total > {PORT_COUNTERS.index('rx_bytes') * 1000 + 1000}")
    (rate,) = prometheus.wait_for(f"({panel_expr}) > 0")
    assert float(rate["value"][1]) > 0


def test_a_node_without_efa_writes_no_series(tmp_path):
    collect(tmp_path, tmp_path / "no-such-sysfs")
    assert (tmp_path / "efa.prom").read_text() == ""
