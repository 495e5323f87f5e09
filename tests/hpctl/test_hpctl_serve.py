"""`hpctl serve RUN [--hours H] [--stop]`: the stack and the run's folder from moto, HyperPod's node API from botocore's
Stubber, the controller's SSM sessions from the recorder. The port forwarding request is checked against botocore's
ssm model; the serve job itself runs on the local Slurm in tests/slurm/test_serve_rehearsal.py. `hpctl status
--slurm` shows a running serve job with its cost per hour."""

from __future__ import annotations

import json
import shlex

from price_list_stub import price_item, stubbed_pricing

from hpctl.common import run_progress
from hpctl.common.ssm import EXIT_MARKER, PORT_FORWARD_DOCUMENT
from hpctl.observe.status import slurm_lines
from tests.hpctl.conftest import REGION
from tests.hpctl.test_hpctl_drill import RUN, expect_controller, start_session_request
from tests.hpctl.test_hpctl_drill import run_in_bucket as run_in_bucket  # the fixture: a run in the bucket
from tests.hpctl.test_hpctl_nodes import CONTROLLER
from tests.hpctl.test_hpctl_nodes import stub as stub  # the fixture: the sagemaker client behind a Stubber

SERVE_JOB = "python3 -m llm_pipeline.jobs.serve_job"


def remote_script(command: str) -> tuple[list[str], str]:
    words = shlex.split(command)
    return words[:-1], words[-1]


def test_serve_submits_the_job_as_the_user_then_forwards_the_nodes_port_here(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session(
        "submitted serve job 41 (3 h limit), waiting for the server",
        "hpl-serve-endpoint=10.1.2.3:41234 41",
        f"{EXIT_MARKER}0",
    )
    code, out, err = hpctl("serve", RUN, "--hours", "3", "--local-port", "8123")
    assert code == 0, err
    # the last session is the forwarding one: through the controller to the node's server, as botocore's model takes it
    request = start_session_request(session_tools.calls())
    assert request["Target"].endswith(f"_controller-{CONTROLLER['InstanceId']}")
    assert request["DocumentName"] == PORT_FORWARD_DOCUMENT
    assert request["Parameters"] == {"host": ["10.1.2.3"], "portNumber": ["41234"], "localPortNumber": ["8123"]}
    assert "submitted serve job 41 (3 h limit)" in out
    assert "serving run run-a (Slurm job 41) at http://127.0.0.1:8123/v1" in out
    (curl,) = [line for line in out.splitlines() if line.startswith("curl ")]
    words = shlex.split(curl)
    assert words[2] == "http://127.0.0.1:8123/v1/completions"
    assert json.loads(words[-1])["model"] == "tuned"


def test_stop_cancels_the_runs_serve_job_on_the_controller(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session("cancelled serve job 41; nothing of it runs", f"{EXIT_MARKER}0")
    code, out, err = hpctl("serve", RUN, "--stop")
    assert code == 0, err
    request = start_session_request(session_tools.calls())
    assert request["DocumentName"] == "AWS-StartNonInteractiveCommand"
    sudo, script = remote_script(request["Parameters"]["command"][0])
    assert sudo == ["sudo", "-n", "-u", "ubuntu", "-H", "bash", "-lc"]
    assert script == f'cd /fsx/payloads && {SERVE_JOB} stop --run-dir /fsx/outputs/run-a; echo "{EXIT_MARKER}$?"'
    assert "cancelled serve job 41" in out and "curl" not in out


def test_a_submit_that_fails_on_the_controller_opens_no_forwarding(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session(
        "error: run run-a is already served by job 40: stop it first (--stop)", f"{EXIT_MARKER}2"
    )
    code, out, err = hpctl("serve", RUN)
    assert code == 2
    assert err.strip().splitlines()[-1] == "error: serve submit failed on the controller (exit 2): see its output above"
    (command,) = start_session_request(session_tools.calls())["Parameters"]["command"]
    _, script = remote_script(command)
    assert f"{SERVE_JOB} submit --run-dir /fsx/outputs/run-a --hours 2;" in script  # the default time limit
    assert "already served by job 40" in out and "curl" not in out


def test_a_submit_without_an_endpoint_is_an_error(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session("submitted serve job 41 (2 h limit), waiting for the server", f"{EXIT_MARKER}0")
    code, _out, err = hpctl("serve", RUN)
    assert code == 2 and "the serve job printed no endpoint" in err


def test_an_unknown_run_is_refused_before_any_session(stub, hpctl, session_tools, run_in_bucket):
    code, _out, err = hpctl("serve", "run-b")
    assert code == 2 and "no run 'run-b'" in err
    assert not session_tools.record.exists()


def test_status_shows_a_running_serve_job_with_its_cost_per_hour(moto_server, session_tools, hpctl):
    session_tools.replay_session(
        "hpl-job 41 gpu RUNNING", "hpl-version slurm 24.11.5", "hpl-serve-job 41 gpu RUNNING 1 run-a"
    )
    code, out, err = hpctl("status", "--slurm")
    assert code == 0, err
    assert "Serving      run-a: job 41 RUNNING on gpu, price unknown (the run's partition is not in cdk.json" in out
    assert "squeue -h -n hpl-serve" in " ".join(session_tools.calls())


def test_the_serve_jobs_cost_is_its_nodes_at_the_hyperpod_price():
    instance = "ml.g5.12xlarge"
    pricing = stubbed_pricing(
        [price_item(f"USW2-Cluster:{instance}", "7.5", REGION)], usage_suffix=f"-Cluster:{instance}", region=REGION
    )
    cost = run_progress.describe_hourly(2, instance, run_progress.cluster_price(pricing, instance, REGION))
    assert cost == f"$15.00/h = 2 x {instance} at $7.5000/h (USW2-Cluster:{instance})"
    served = {"run": "run-a", "job": "41", "state": "RUNNING", "partition": "gpu", "cost": cost}
    lines = slurm_lines({"version": "slurm 24.11.5", "running": 1, "queued": 0, "saved": {}, "serving": [served]})
    assert lines[-1] == f"Serving      run-a: job 41 RUNNING on gpu, {cost}"
