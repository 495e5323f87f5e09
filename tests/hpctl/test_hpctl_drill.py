"""`hpctl drill RUN --kill-rank | --fail-node`: the stack and the run's folder come from moto, HyperPod's cluster and
node APIs from botocore's Stubber, and the controller's SSM session from the recorder, whose StartSession request is
checked against botocore's ssm model."""

from __future__ import annotations

import json
import shlex

import boto3
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

from hpctl.common.ssm import EXIT_MARKER
from tests.hpctl.conftest import BUCKET, CLUSTER, REGION
from tests.hpctl.test_hpctl_nodes import CONTROLLER, GOOD, cluster_reply
from tests.hpctl.test_hpctl_nodes import stub as stub  # the fixture: the sagemaker client behind a Stubber

RUN = "run-a"


@pytest.fixture
def run_in_bucket(deployed):
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key=f"outputs/{RUN}/logs/pipeline.json", Body=b"[]"
    )


def expect_controller(stub):
    stub.add_response("describe_cluster", cluster_reply(), {"ClusterName": CLUSTER})
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [CONTROLLER, GOOD]}, {"ClusterName": CLUSTER})


def start_session_request(argv: list[str]) -> dict:
    """The recorded `aws ssm start-session` call as its API request, checked against botocore's ssm model."""
    assert argv[:2] == ["ssm", "start-session"]
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    request = {
        "Target": options["--target"],
        "DocumentName": options["--document-name"],
        "Parameters": json.loads(options["--parameters"]),
    }
    model = boto3.Session(region_name=REGION)._session.get_service_model("ssm")
    validate_parameters(request, model.operation_model("StartSession").input_shape)
    assert options["--region"] == REGION
    return request


def test_kill_rank_runs_the_drill_as_root_on_the_controller_and_says_where_the_figures_are(
    stub, hpctl, session_tools, run_in_bucket
):
    expect_controller(stub)
    session_tools.replay_session("drill: kill-rank on ip-10-1-2-3, job 12: killed rank 0 (pid 811)", f"{EXIT_MARKER}0")
    code, out, err = hpctl("drill", RUN, "--kill-rank", "--yes")
    assert code == 0, err
    request = start_session_request(session_tools.calls())
    assert request["Target"].endswith(f"_controller-{CONTROLLER['InstanceId']}")
    (command,) = request["Parameters"]["command"]
    sudo, script = shlex.split(command)[:-1], shlex.split(command)[-1]
    assert sudo == ["sudo", "-n", "-H", "bash", "-lc"]
    drill = "python3 -m llm_pipeline.jobs.drill kill-rank --run-dir /fsx/outputs/run-a"
    assert script == f'cd /fsx/payloads && {drill}; echo "{EXIT_MARKER}$?"'
    assert "drill: kill-rank on ip-10-1-2-3, job 12: killed rank 0 (pid 811)" in out and EXIT_MARKER not in out
    assert "/fsx/outputs/run-a/logs/recovery.json on FSx" in out
    assert f"s3://{BUCKET}/outputs/run-a/logs/recovery.json" in out
    assert ".venv/bin/hpctl events --run run-a --follow" in out
    assert "state=resume" not in out  # only a failed node needs bringing back


def test_a_drill_that_fails_on_the_controller_is_an_error(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session("error: step train (job 12) is not running (PENDING): try again", f"{EXIT_MARKER}2")
    code, out, err = hpctl("drill", RUN, "--fail-node", "--yes")
    assert code == 2
    assert "fail-node --run-dir /fsx/outputs/run-a" in session_tools.calls()[-1]
    assert "is not running (PENDING)" in out
    assert err.strip() == "error: the drill failed on the controller (exit 2): see its output above"
    assert "recovery.json" not in out


def test_a_session_that_ends_without_the_exit_marker_is_an_error(stub, hpctl, session_tools, run_in_bucket):
    expect_controller(stub)
    session_tools.replay_session("drill: fail-node on ip-10-1-2-3, job 12")  # cut off before the marker
    code, _out, err = hpctl("drill", RUN, "--fail-node", "--yes")
    assert code == 2 and "the session ended before the drill finished" in err


def test_the_drill_asks_first_and_starts_no_session_without_an_answer(stub, hpctl, session_tools, run_in_bucket):
    stub.add_response("describe_cluster", cluster_reply(), {"ClusterName": CLUSTER})
    code, _out, err = hpctl("drill", RUN, "--kill-rank")
    assert code == 2 and "no terminal to confirm at; rerun with --yes" in err
    assert not session_tools.record.exists()


def test_an_unknown_run_is_refused_naming_the_runs(stub, hpctl, session_tools, run_in_bucket):
    code, _out, err = hpctl("drill", "run-b", "--fail-node", "--yes")
    assert code == 2 and f"no run 'run-b' in s3://{BUCKET}/outputs/ (runs: {RUN})" in err
    assert not session_tools.record.exists()


def test_the_model_check_catches_a_malformed_request():
    with pytest.raises(ParamValidationError):
        start_session_request(["ssm", "start-session", "--target", "t", "--document-name", "d", "--parameters", "[]"])


def test_one_fault_is_required(hpctl):
    with pytest.raises(SystemExit):
        hpctl("drill", RUN, "--kill-rank", "--fail-node")
