"""`hpctl logs`: lifecycle logs from CloudWatch Logs, pipeline step logs from the outputs prefix in S3."""

import time
from datetime import datetime, timezone

import boto3
import pytest

from hpctl.observe.lifecycle_logs import show_lifecycle_logs

NOW_MS = int(time.time() * 1000)


def stamp(ms):
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@pytest.fixture
def lifecycle_logs(deployed):
    """HyperPod's log group with one stream per node, as the lifecycle scripts fill it."""
    logs = boto3.client("logs", region_name=deployed.region)
    group = f"/aws/sagemaker/Clusters/{deployed.cluster}/{deployed.cluster_id}"
    logs.create_log_group(logGroupName=group)
    streams = {
        "controller/controller-0": ["mounting /fsx", "starting slurmctld", "lifecycle done"],
        "compute/compute-0": ["mounting /fsx", "neuron devices: 16", "lifecycle done"],
    }
    for node, lines in streams.items():
        stream = f"LifecycleConfig/{node}"
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": NOW_MS + index, "message": line} for index, line in enumerate(lines)],
        )
    logs.create_log_stream(logGroupName=group, logStreamName="SagemakerHealthMonitoringAgent/compute/compute-0")
    return logs, group


def test_every_node_lifecycle_log(lifecycle_logs, hpctl):
    code, out, _ = hpctl("logs", "lifecycle")
    assert code == 0
    assert out.splitlines() == [
        "==> LifecycleConfig/compute/compute-0 <==",
        f"{stamp(NOW_MS)}  mounting /fsx",
        f"{stamp(NOW_MS + 1)}  neuron devices: 16",
        f"{stamp(NOW_MS + 2)}  lifecycle done",
        "==> LifecycleConfig/controller/controller-0 <==",
        f"{stamp(NOW_MS)}  mounting /fsx",
        f"{stamp(NOW_MS + 1)}  starting slurmctld",
        f"{stamp(NOW_MS + 2)}  lifecycle done",
    ]


@pytest.mark.parametrize("node", ["controller-0", "controller"])
def test_one_node_or_group_with_tail(lifecycle_logs, hpctl, node):
    code, out, _ = hpctl("logs", "lifecycle", "--node", node, "--tail", "2")
    assert code == 0
    assert [line.split("  ", 1)[1] for line in out.splitlines()] == ["starting slurmctld", "lifecycle done"]


def test_unknown_node(lifecycle_logs, hpctl):
    code, _, err = hpctl("logs", "lifecycle", "--node", "i-0000")
    assert (code, err) == (
        2,
        "error: no lifecycle log for i-0000 (logs exist for: compute/compute-0, controller/controller-0)\n",
    )


def test_no_logs_yet(deployed, hpctl):
    code, _, err = hpctl("logs", "lifecycle")
    group = f"/aws/sagemaker/Clusters/{deployed.cluster}/{deployed.cluster_id}"
    assert (code, err) == (
        2,
        f"error: no lifecycle logs yet ({group} has none): nodes write them once their "
        "lifecycle script starts; check `hpctl status`\n",
    )


def test_follow_prints_new_lines_until_interrupted(lifecycle_logs, deployed, capsys):
    logs, group = lifecycle_logs
    polls = []

    def sleep(seconds):  # the node writes more between polls; the user presses Ctrl-C on the third
        polls.append(seconds)
        if len(polls) == 1:
            logs.put_log_events(
                logGroupName=group,
                logStreamName="LifecycleConfig/controller/controller-0",
                logEvents=[{"timestamp": NOW_MS + 10, "message": "slurmctld is up"}],
            )
        if len(polls) == 3:
            raise KeyboardInterrupt

    session = boto3.Session(region_name=deployed.region)
    show_lifecycle_logs(session, group, node=None, tail=1, follow=True, interval_s=2, sleep=sleep)
    out = capsys.readouterr().out.splitlines()
    assert polls == [2, 2, 2]
    assert out[-2:] == [f"[controller/controller-0] {stamp(NOW_MS + 10)}  slurmctld is up", ""]
    assert sum("lifecycle done" in line for line in out) == 2  # printed once per node, never again


@pytest.fixture
def step_logs(deployed):
    s3 = boto3.client("s3", region_name=deployed.region)
    files = {
        "outputs/tiny/logs/download-101.log": "fetching\ndone\n",
        "outputs/tiny/logs/train-103.log": "step 1 loss 2.0\nstep 2 loss 1.5\nstep 3 loss 1.2\n",
        "outputs/tiny/adapter/adapter_model.safetensors": "weights",
        "outputs/other/checkpoints/checkpoint-1/x": "",
    }
    for key, body in files.items():
        s3.put_object(Bucket=deployed.bucket, Key=key, Body=body.encode())
    return s3


def test_list_runs(step_logs, hpctl):
    code, out, err = hpctl("logs", "steps")
    assert err == ""
    rows = [line.split()[:2] for line in out.splitlines()]
    assert (code, rows) == (0, [["RUN", "LOG"], ["other", "0"], ["tiny", "2"]])


def test_list_a_run_s_logs(step_logs, hpctl):
    code, out, _ = hpctl("logs", "steps", "tiny")
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["download-101.log", "14"], ["train-103.log", "48"]]


@pytest.mark.parametrize("name", ["train", "train-103.log"])
def test_print_a_step_log_by_step_or_file(step_logs, hpctl, name):
    code, out, _ = hpctl("logs", "steps", "tiny", name, "--tail", "2")
    assert (code, out) == (0, "step 2 loss 1.5\nstep 3 loss 1.2\n")


def test_unknown_run_and_log(step_logs, hpctl):
    assert (
        hpctl("logs", "steps", "nope")[2]
        == "error: no run 'nope' in s3://sagemaker-hpl-test-bucket/outputs/ (runs: other, tiny)\n"
    )
    assert (
        hpctl("logs", "steps", "tiny", "merge")[2]
        == "error: no log 'merge' in run tiny (logs: download-101.log, train-103.log)\n"
    )
    assert (
        hpctl("logs", "steps", "other")[2]
        == "error: run other has no logs in s3://sagemaker-hpl-test-bucket/outputs/other/logs/ yet\n"
    )


def test_no_runs_yet(deployed, hpctl):
    code, _, err = hpctl("logs", "steps")
    assert (code, err) == (
        2,
        f"error: no runs in s3://{deployed.bucket}/outputs/ yet: submit one with `hpctl submit`\n",
    )
