"""`hpctl shell`: the SSM target and the AWS CLI command, run for real with a recorder as `aws`."""

import os
import subprocess
import sys
from pathlib import Path

from hpctl.common.cluster import ClusterState, Node, ssm_target
from hpctl.common.ssm import SessionRequest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_child(*argv):
    """hpctl in its own process (shell ends by exec'ing the AWS CLI, which would replace pytest)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO_ROOT), str(REPO_ROOT / "payloads")))}
    return subprocess.run([sys.executable, "-m", "hpctl", *argv], env=env, capture_output=True, text=True, timeout=120)


def test_target_uses_the_id_at_the_end_of_the_arn_not_the_name():
    cluster = ClusterState(
        name="hpl",
        arn="arn:aws:sagemaker:us-west-2:111122223333:cluster/2hd31rmi9mde",
        status="InService",
        failure_message="",
        groups=(),
    )
    node = Node(
        group="controller",
        instance_id="i-0123456789abcdef0",
        instance_type="ml.c5.xlarge",
        status="Running",
        message="",
        launch_time=None,
    )
    assert ssm_target(cluster, node) == "sagemaker-cluster:2hd31rmi9mde_controller-i-0123456789abcdef0"


def test_interactive_session_command():
    request = SessionRequest(target="sagemaker-cluster:abc_controller-i-1", region="eu-north-1", profile="ops")
    assert request.argv() == [
        "aws",
        "ssm",
        "start-session",
        "--target",
        "sagemaker-cluster:abc_controller-i-1",
        "--region",
        "eu-north-1",
        "--profile",
        "ops",
    ]


def test_exec_hands_the_terminal_to_aws_ssm_start_session(moto_server, session_tools):
    result = run_child("shell")
    assert result.returncode == 0, result.stderr
    assert session_tools.calls() == [
        "ssm",
        "start-session",
        "--target",
        "sagemaker-cluster:hpl-test-cluster_controller-controller-0",
        "--region",
        "us-west-2",
    ]
    assert result.stderr == "session on controller/controller-0 (Running)\n"


def test_exit_status_is_the_session_s(moto_server, session_tools, monkeypatch):
    monkeypatch.setenv("HPCTL_TEST_RC", "255")  # e.g. TargetNotConnected
    assert run_child("shell").returncode == 255


def test_node_and_group_choose_another_node(moto_server, session_tools):
    assert run_child("shell", "--node", "compute-0").returncode == 0
    assert session_tools.calls()[3] == "sagemaker-cluster:hpl-test-cluster_compute-compute-0"
    assert run_child("shell", "--group", "compute", "--region", "us-west-2").returncode == 0
    assert session_tools.calls()[3] == "sagemaker-cluster:hpl-test-cluster_compute-compute-0"


def test_a_creating_cluster_can_be_entered_to_watch_its_setup(moto_server, session_tools):
    moto_server.set_cluster(status="Creating")
    assert run_child("shell").returncode == 0
    assert session_tools.calls()[:2] == ["ssm", "start-session"]


def test_unknown_node(deployed, session_tools, hpctl):
    code, _, err = hpctl("shell", "--node", "i-0000")
    assert code == 2
    assert err == (
        f"error: node i-0000 is not in cluster {deployed.cluster} (nodes: compute-0, controller-0); "
        "see `hpctl status`\n"
    )
    assert not session_tools.record.exists()


def test_plugin_missing(deployed, session_tools, hpctl):
    (session_tools.bin_dir / "session-manager-plugin").unlink()
    code, _, err = hpctl("shell")
    assert code == 2
    assert err == (
        "error: the Session Manager plugin (`session-manager-plugin`) is not on PATH; `aws ssm start-session` "
        "needs it: install it (https://docs.aws.amazon.com/systems-manager/latest/userguide/"
        "session-manager-working-with-install-plugin.html)\n"
    )


def test_aws_cli_missing(deployed, session_tools, hpctl):
    (session_tools.bin_dir / "aws").unlink()
    code, _, err = hpctl("shell")
    assert code == 2
    assert err == (
        "error: the AWS CLI (`aws`) is not on PATH: install AWS CLI v2 "
        "(https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html)\n"
    )


def test_failed_cluster(deployed, session_tools, hpctl):
    deployed.set_cluster(status="Failed", failure="Lifecycle script did not run successfully on controller-0")
    code, _, err = hpctl("shell")
    assert code == 2
    assert err == (
        f"error: cluster {deployed.cluster} failed: Lifecycle script did not run successfully on controller-0\n"
    )
    assert not session_tools.record.exists()


def test_no_nodes_yet(deployed, session_tools, hpctl):
    deployed.remove_nodes()
    code, _, err = hpctl("shell")
    assert code == 2
    assert err == (
        f"error: no nodes yet in group controller of cluster {deployed.cluster}: "
        "wait until they are running (`hpctl wait`, `hpctl status`)\n"
    )
