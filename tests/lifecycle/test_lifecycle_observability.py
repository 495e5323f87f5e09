"""observability = prometheus on each kind of node: exactly the exporters its role and accelerator call
for, started from the stack's images, and a second run that changes nothing."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
from lifecycle_node import CLUSTER, CONTROLLER_IP, FACTS, GPU_IPS, FakeNode

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com/cdk-assets"
IMAGES = {
    "node_exporter_image": f"{ECR}:node",
    "collector_image": f"{ECR}:collector",
    "dcgm_exporter_image": f"{ECR}:dcgm",
}
REMOTE_WRITE = "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1234/api/v1/remote_write"
TEXTFILE = "/var/lib/hyperpod-lora/metrics"
G5_IP = "10.1.3.1"


def prometheus_facts() -> dict:
    facts = copy.deepcopy(FACTS)
    facts.update(
        observability="prometheus", metrics_remote_write_url=REMOTE_WRITE, metrics_textfile_path=TEXTFILE, **IMAGES
    )
    facts["compute_groups"] += ",g5"
    facts["partitions"]["g5"] = {
        **facts["partitions"]["p5"],
        "group": "g5",
        "partition": "g5",
        "instance_type": "ml.g5.xlarge",
        "devices_per_node": 1,
        "efa_interfaces": 0,
        "efa_device_rdma": 0,
    }
    return facts


@pytest.fixture
def bridge_module(tmp_path: Path) -> dict[str, str]:
    """An importable prometheus_client for the node's python3: the Neuron bridge's one dependency."""
    (tmp_path / "site" / "prometheus_client").mkdir(parents=True)
    (tmp_path / "site" / "prometheus_client" / "__init__.py").write_text("")
    return {"PYTHONPATH": str(tmp_path / "site")}


@pytest.fixture
def metrics_node(tmp_path: Path, node: FakeNode) -> FakeNode:
    del node  # the root check
    return FakeNode(tmp_path / "metrics-node", facts=prometheus_facts(), cluster={**CLUSTER, "g5": [("g5-1", G5_IP)]})


def containers(run) -> dict[str, list[str]]:
    """Started containers: name -> the arguments after the image."""
    started = {}
    for call in run.called("docker"):
        words = call.split()
        if words[1] == "run":
            image = next(word for word in words if word.startswith(ECR))
            started[words[words.index("--name") + 1]] = words[words.index(image) :]
    return started


def units(run) -> list[str]:
    return sorted(call.split()[-1] for call in run.called("systemctl") if call.split()[1] == "restart")


SWEEP = ["hpl-run-sweep.service", "hpl-run-sweep.timer"]  # every compute node: run metrics end with their job
# (address, what runs there): containers with their image, systemd units, scrape jobs of the collector
ROLES = {
    "controller": (CONTROLLER_IP, {"hpl-node-exporter": "node", "hpl-collector": "collector"},
                   ["hpl-slurm-metrics.service", "hpl-slurm-metrics.timer"], ["node"]),
    "trn1": ("10.1.1.1", {"hpl-node-exporter": "node", "hpl-collector": "collector"},
             ["hpl-efa-counters.service", "hpl-efa-counters.timer", "hpl-neuron-monitor.service", *SWEEP],
             ["node", "neuron"]),
    "g5.xlarge": (G5_IP, {"hpl-node-exporter": "node", "hpl-dcgm-exporter": "dcgm", "hpl-collector": "collector"},
                  ["hpl-gpu-jobs.service", "hpl-gpu-jobs.timer", *SWEEP], ["node", "dcgm"]),
    "p5": (GPU_IPS[0], {"hpl-node-exporter": "node", "hpl-dcgm-exporter": "dcgm", "hpl-collector": "collector"},
           ["hpl-efa-counters.service", "hpl-efa-counters.timer", "hpl-gpu-jobs.service", "hpl-gpu-jobs.timer",
            *SWEEP], ["node", "dcgm"]),
}  # fmt: skip


@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_exactly_its_exporters_and_a_second_run_changes_nothing(metrics_node, bridge_module, role):
    ip, expected_containers, expected_units, scrape_jobs = ROLES[role]
    metrics_node.add_neuron_devices()
    metrics_node.add_efa_devices({"trn1": 8, "p5": 32}.get(role, 0))
    gpus = {"FAKE_GPUS": "1", **bridge_module} if role == "g5.xlarge" else bridge_module
    first = metrics_node.run(ip, **gpus)

    assert first.returncode == 0, first.stderr + first.stdout
    assert "WARNING" not in first.stdout
    started = containers(first)
    assert {name: args[0].rsplit(":", 1)[1] for name, args in started.items()} == expected_containers
    assert units(first) == expected_units
    node_args = started["hpl-node-exporter"]
    assert f"--collector.textfile.directory=/host{TEXTFILE}" in node_args
    assert "--no-collector.infiniband" in node_args  # it cannot read EFA's counters: hpl-efa-counters does
    if "hpl-dcgm-exporter" in started:
        assert "--hpc-job-mapping-dir=/hpc-jobs" in started["hpl-dcgm-exporter"]  # the Slurm job id label
    assert started["hpl-collector"][1:3] == ["--agent", "--config.file=/etc/hpl/prometheus-agent.yml"]
    config = (metrics_node.root / "etc/hyperpod-lora/prometheus-agent.yml").read_text()
    assert [line.split(": ")[1] for line in config.splitlines() if "job_name" in line] == scrape_jobs
    assert f"url: {REMOTE_WRITE}\n    sigv4:\n      region: us-west-2" in config
    textfile = metrics_node.root / TEXTFILE.lstrip("/")
    assert textfile.is_dir() and textfile.stat().st_uid == 4242  # the jobs' user writes its metrics there
    assert (metrics_node.root / "opt/hyperpod-lora/slurm_metrics.py").is_file()

    before = metrics_node.snapshot()
    second = metrics_node.run(ip, **gpus)
    assert second.returncode == 0, second.stderr
    assert metrics_node.snapshot() == before
    changing = [c for c in second.called("docker") + second.called("systemctl") if c.split()[1] != "inspect"]
    assert changing == [c for c in second.called("systemctl") if c.split()[1] == "is-active"]
    assert not second.called("aws")  # no registry login when nothing is pulled


def test_a_changed_remote_write_url_recreates_only_the_collector(metrics_node):
    metrics_node.run(CONTROLLER_IP)
    facts_file = metrics_node.scripts / "cluster-facts.json"
    facts_file.write_text(facts_file.read_text().replace("ws-1234", "ws-5678"))
    run = metrics_node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert list(containers(run)) == ["hpl-collector"]
    assert "docker rm -f hpl-collector" in run.calls
    assert "unchanged: container hpl-node-exporter" in run.stdout


def test_a_stopped_unit_is_started_again(metrics_node):
    metrics_node.run(CONTROLLER_IP)
    (metrics_node.base / "state/units/hpl-slurm-metrics.timer").unlink()
    run = metrics_node.run(CONTROLLER_IP)
    assert "systemctl enable --now hpl-slurm-metrics.timer" in run.calls
    assert "started hpl-slurm-metrics.timer (was not running)" in run.stdout


@pytest.mark.parametrize("mode", ["off", "managed"])
def test_other_modes_install_nothing(node: FakeNode, mode):
    facts = copy.deepcopy(FACTS)
    facts["observability"] = mode
    (node.scripts / "cluster-facts.json").write_text(json.dumps(facts))
    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert not run.called("docker") and not run.called("systemctl")
    assert f"observability is {mode}" in run.stdout


@pytest.mark.parametrize("epilog", ["/opt/slurm/etc/epilog.d/*", "/opt/slurm/etc/epilog.sh", ""])
def test_a_compute_node_joins_slurms_epilog_folder_and_sweeps_every_15_s(metrics_node, epilog):
    conf = metrics_node.slurm_etc / "slurm.conf"
    conf.write_text(conf.read_text() + (f"Epilog={epilog}  # HyperPod's\n" if epilog else ""))
    metrics_node.add_neuron_devices()
    metrics_node.add_efa_devices(8)
    run = metrics_node.run("10.1.1.1")

    assert run.returncode == 0, run.stderr + run.stdout
    installed = metrics_node.root / "opt/slurm/etc/epilog.d/hpl-run-metrics.sh"
    if epilog.endswith("/*"):
        script = installed.read_text()
        assert f"/usr/bin/python3 /opt/hyperpod-lora/slurm_metrics.py run-ended {TEXTFILE} " in script
        assert script.endswith("exit 0\n") and installed.stat().st_mode & 0o777 == 0o755  # never drains the node
    else:
        assert not installed.exists()
        assert f"slurm.conf's Epilog is {epilog or 'not set'}, not a folder glob" in run.stdout
    timer = (metrics_node.root / "etc/systemd/system/hpl-run-sweep.timer").read_text()
    assert "OnUnitActiveSec=15s" in timer
    service = (metrics_node.root / "etc/systemd/system/hpl-run-sweep.service").read_text()
    assert f"ExecStart=/usr/bin/python3 /opt/hyperpod-lora/slurm_metrics.py sweep {TEXTFILE}\n" in service


def test_the_neuron_bridge_without_prometheus_client_is_a_warning_and_a_series_not_a_restart_loop(
    metrics_node, bridge_module
):
    metrics_node.add_neuron_devices()
    metrics_node.add_efa_devices(8)
    unit = metrics_node.root / "etc/systemd/system/hpl-neuron-monitor.service"
    failed = metrics_node.root / TEXTFILE.lstrip("/") / "hpl_exporter_neuron.prom"
    with_module = metrics_node.run("10.1.1.1", **bridge_module)
    assert with_module.returncode == 0 and unit.is_file() and not failed.exists()
    assert "StartLimitBurst=5" in unit.read_text()  # even a bridge that fails later stops retrying

    without = metrics_node.run("10.1.1.1")  # the AMI's python3 has no prometheus_client
    assert without.returncode == 0, without.stderr
    assert "WARNING: python module prometheus_client missing for neuron-monitor-prometheus.py" in without.stdout
    assert not unit.exists() and "systemctl disable --now hpl-neuron-monitor.service" in without.calls
    assert 'hpl_exporter_failed{exporter="neuron",reason="python module prometheus_client missing' in failed.read_text()


OPENMETRICS = "MetricsType=metrics/openmetrics\nSlurmctldPort=6820\n"


@pytest.mark.parametrize(
    ("version", "conf", "why"),
    [
        ("25.11.2", OPENMETRICS, ""),
        ("26.05.0", OPENMETRICS, ""),
        ("24.11.5", OPENMETRICS, "Slurm 24.11.5 has no OpenMetrics endpoints (25.11 added them)"),
        ("25.11.2", "", "slurm.conf does not set MetricsType=metrics/openmetrics (HyperPod owns slurm.conf)"),
        ("25.11.2", OPENMETRICS + "PrivateData=jobs\n", "slurm.conf sets PrivateData=jobs, which turns Slurm's"),
    ],
)
def test_slurm_25_11_openmetrics_replace_the_poll_where_slurm_conf_enables_them(metrics_node, version, conf, why):
    slurm_conf = metrics_node.slurm_etc / "slurm.conf"
    slurm_conf.write_text(slurm_conf.read_text() + conf)
    run = metrics_node.run(CONTROLLER_IP, FAKE_SLURM_VERSION=version)

    assert run.returncode == 0, run.stderr + run.stdout
    config = (metrics_node.root / "etc/hyperpod-lora/prometheus-agent.yml").read_text()
    timer = metrics_node.root / "etc/systemd/system/hpl-slurm-metrics.timer"
    if why:
        assert f"Slurm's series from the sinfo/squeue poll: {why}" in run.stdout
        assert timer.is_file() and "slurm-partitions" not in config
        return
    assert not timer.exists() and "hpl-slurm-metrics" not in " ".join(run.calls)
    agent_config = metrics_node.root / "etc/hyperpod-lora/prometheus-agent.yml"
    checked = subprocess.run(
        ["promtool", "check", "config", "--agent", str(agent_config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr  # Debian's promtool (tools/system_packages.sh)
    for endpoint in ("jobs", "nodes", "partitions", "scheduler"):
        assert (
            f"  - job_name: slurm-{endpoint}\n    metrics_path: /metrics/{endpoint}\n    static_configs:\n"
            '      - targets: ["localhost:6820"]\n'
        ) in config


def test_a_controller_moved_to_openmetrics_drops_its_poll_timer(metrics_node):
    assert metrics_node.run(CONTROLLER_IP, FAKE_SLURM_VERSION="24.11.5").returncode == 0
    timer = metrics_node.root / "etc/systemd/system/hpl-slurm-metrics.timer"
    assert timer.is_file()
    slurm_conf = metrics_node.slurm_etc / "slurm.conf"
    slurm_conf.write_text(slurm_conf.read_text() + OPENMETRICS)
    run = metrics_node.run(CONTROLLER_IP, FAKE_SLURM_VERSION="25.11.2")
    assert run.returncode == 0 and not timer.exists()
    assert "systemctl disable --now hpl-slurm-metrics.timer" in run.calls
