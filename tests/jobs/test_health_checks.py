"""The health gate's reading of each tool's output (jobs/health.py), in the formats the tools' guides show:
nvidia-smi's --query-gpu CSV, dcgmi diag's result table, neuron-ls --json-output, nccom-test's table and its
"Avg bus bandwidth" line, nccl-tests' summary lines. Also the run config's check names and the drain reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib

from llm_pipeline.config import ConfigError, from_dict
from llm_pipeline.jobs import health

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

GPU_CSV = "0, NVIDIA H100 80GB HBM3, 81559, 0\n1, NVIDIA H100 80GB HBM3, 81559, [N/A]\n"


def test_nvidia_smi_counts_gpus_and_uncorrected_ecc_errors():
    assert health.parse_nvidia_smi(GPU_CSV, 0, 2) == ""
    assert health.parse_nvidia_smi(GPU_CSV, 0, 8) == "2 of 8 GPUs"
    bad = GPU_CSV.replace("81559, 0", "81559, 3")
    assert health.parse_nvidia_smi(bad, 0, 2) == "GPU 0 3 uncorrected ECC errors"
    lost = "Unable to determine the device handle for GPU0000:53:00.0: Unknown Error\n"
    assert health.parse_nvidia_smi(lost, 255, 8) == "exit 255: " + lost.strip()


DCGM_TABLE = """\
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| Persistence Mode          | {persistence}                                  |
| Environment Variables     | Pass                                           |
+---------------------------+------------------------------------------------+
"""


def test_dcgm_diag_names_the_failed_tests():
    assert health.parse_dcgm_diag(DCGM_TABLE.format(persistence="Pass"), 0) == ""
    failed = DCGM_TABLE.format(persistence="Fail")
    assert health.parse_dcgm_diag(failed, 226) == "failed: Persistence Mode"
    assert health.parse_dcgm_diag("Error: unable to connect to host engine\n", 255).startswith("exit 255: Error")
    assert health.parse_dcgm_diag("", 0) == "no test results: no output"


def neuron_ls(*devices: tuple[int, int]) -> str:
    return json.dumps(
        [
            {"neuron_device": i, "bdf": f"10:{i}c.0", "nc_count": cores, "memory_size": memory, "neuron_processes": []}
            for i, (cores, memory) in enumerate(devices)
        ]
    )


def test_neuron_ls_counts_neuroncores_and_memory_per_device():
    full = neuron_ls(*[(2, 34359738368)] * 16)  # trn1.32xlarge: 16 devices, 2 NeuronCores, 32 GiB each
    assert health.parse_neuron_ls(full, 0, 32) == ""
    assert health.parse_neuron_memory(full, 0) == ""
    short = neuron_ls(*[(2, 34359738368)] * 15)
    assert health.parse_neuron_ls(short, 0, 32) == "30 NeuronCores on 15 devices, 32 expected"
    small = neuron_ls((2, 34359738368), (2, 0))
    assert health.parse_neuron_memory(small, 0) == "device(s) 1 report less memory than 34359738368 bytes"
    assert health.parse_neuron_ls("no Neuron driver found\n", 1, 32) == "exit 1: no Neuron driver found"
    assert health.parse_neuron_ls("[]", 0, 32) == "no Neuron device listed: []"


NCCOM = """\
     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)
    33554432        33554432    uint8         801          41.89          41.89
Avg bus bandwidth:      41.8900GB/s
"""


def test_nccom_test_needs_a_bus_bandwidth():
    assert health.parse_nccom_test(NCCOM, 0) == ""
    assert health.parse_nccom_test(NCCOM.rsplit("Avg", 1)[0], 0).startswith("no bus bandwidth reported")
    assert health.parse_nccom_test("nrt_init failed\n", 1) == "exit 1: nrt_init failed"


NCCL_SUMMARY = "#  8388608  2097152  float  sum  -1  95.1  88.2  165.4  0  94.7  88.6  166.1  0\n"


def test_nccl_tests_need_zero_wrong_values_and_a_bandwidth():
    ok = NCCL_SUMMARY + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 165.7\n"
    assert health.parse_nccl_tests(ok, 0) == ""
    wrong = NCCL_SUMMARY + "# Out of bounds values : 12 FAILED\n# Avg bus bandwidth    : 165.7\n"
    assert health.parse_nccl_tests(wrong, 0) == "12 wrong values after the all-reduce"
    assert health.parse_nccl_tests(NCCL_SUMMARY, 0).startswith("no result summary")


def test_the_checks_each_accelerator_runs_less_those_skipped_by_name():
    assert health.chosen_checks("cuda", ()) == (["nvidia-smi", "dcgm-diag"], ["nccl-all-reduce"])
    assert health.chosen_checks("cuda", ("dcgm-diag",)) == (["nvidia-smi"], ["nccl-all-reduce"])
    assert health.chosen_checks("neuron", ()) == (["neuron-ls", "neuron-memory", "nccom-all-reduce"], [])
    assert health.chosen_checks("none", ()) == ([], [])


def test_an_unknown_check_name_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        from_dict({"train": {"health_skip": ["dcgm-diag", "dcgm"]}})
    assert str(refused.value).startswith("train.health_skip: invalid value 'dcgm' (allowed: nvidia-smi, dcgm-diag,")
    assert "\n" not in str(refused.value)
    assert from_dict({"train": {"health_skip": ["dcgm-diag"]}}).train.health_skip == ("dcgm-diag",)


def test_a_failed_node_reason_names_the_check_and_the_version():
    result = health.NodeResult("node1", "7", "train")
    result.checks = [health.CheckResult("nvidia-smi", False, "7 of 8 GPUs"), health.CheckResult("dcgm-diag", True)]
    assert result.reason() == f"HealthCheck:Failed nvidia-smi: 7 of 8 GPUs ({health.CHECKS_VERSION})"
    assert not result.passed


def test_the_operations_page_s_run_config_keys_load_and_name_every_check():
    section = OPERATIONS.read_text().split("### The health gate", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    train = from_dict(tomllib.loads(block)).train
    assert train.health_skip == ("dcgm-diag",) and train.health_node_action == "drain"
    for name in health.CHECKS:
        assert f"`{name}`:" in section, f"docs/operations.md's health gate table: {name}"


def scontrol_calls(monkeypatch, refuse: str = "") -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(argv):
        calls.append(argv)
        refused = refuse and refuse in " ".join(argv)
        return health.subprocess.CompletedProcess(
            argv, 1 if refused else 0, "", "Access/permission denied" * bool(refused)
        )

    monkeypatch.setattr(health, "slurm", fake)
    return calls


def test_a_failed_node_is_drained_or_handed_to_hyperpod_with_its_reason(monkeypatch):
    calls = scontrol_calls(monkeypatch)
    reason = f"HealthCheck:Failed dcgm-diag: failed: Memory ({health.CHECKS_VERSION})"
    assert health.mark_failed({"node1": reason}, "drain") == []
    assert calls[-1] == ["scontrol", "update", "nodename=node1", "state=drain", f"reason={reason}"]
    health.mark_failed({"node1": reason}, "replace")
    assert calls[-1] == ["scontrol", "update", "nodename=node1", "state=fail", f"reason=Action:Replace {reason}"]
    health.mark_failed({"node1": reason}, "reboot")
    assert calls[-1][3:] == ["state=fail", f"reason=Action:Reboot {reason}"]


def test_a_refused_drain_is_reported_and_the_job_still_moves(monkeypatch):
    calls = scontrol_calls(monkeypatch, refuse="state=drain")
    assert health.mark_failed({"node1": "why"}, "drain") == ["node1 (Access/permission denied)"]
    monkeypatch.setattr(health.signal, "signal", lambda *_: None)  # the requeue's SIGTERM is this test's own
    assert health.requeue_without("7", ["node1", "node2"]) == ""
    assert calls[-2:] == [["scontrol", "requeue", "7"], ["scontrol", "update", "jobid=7", "excnodelist=node1,node2"]]


def test_the_exclusion_keeps_every_node_this_job_failed(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        {"node": "node1", "job": "7", "verdict": "HealthCheck:Failed x"},
        {"node": "node2", "job": "7", "verdict": ""},
        {"node": "node3", "job": "8", "verdict": "HealthCheck:Failed y"},
        {"node": "node4", "job": "7", "verdict": "HealthCheck:Failed z"},
    ]
    (logs / health.RESULTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert health.failed_before(tmp_path, "7") == ["node1", "node4"]


def test_the_gate_runs_on_hyperpod_or_where_asked(tmp_path):
    assert health.gate_enabled({"HPL_SAGEMAKER_CLUSTER_DIR": str(tmp_path)})
    assert health.gate_enabled({"HPL_SAGEMAKER_CLUSTER_DIR": str(tmp_path / "absent"), "HPL_HEALTH_GATE": "1"})
    assert not health.gate_enabled({"HPL_SAGEMAKER_CLUSTER_DIR": str(tmp_path / "absent")})
