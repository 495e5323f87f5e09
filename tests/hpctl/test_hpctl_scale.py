"""`hpctl scale` and `hpctl operations`: the stack comes from moto, HyperPod's node and operation APIs from
botocore's Stubber (every request checked against botocore's sagemaker model), what Slurm runs from the
controller's SSM session as the recorder replays it."""

from datetime import datetime, timezone

from hpctl.common.slurm_activity import JOB_TAG, NODE_TAG, VERSION_TAG
from tests.hpctl.conftest import CLUSTER
from tests.hpctl.test_hpctl_nodes import ARN, CONTROLLER, cluster_reply, node
from tests.hpctl.test_hpctl_nodes import stub as stub  # the fixture: the sagemaker client behind a Stubber

IDLE = node("compute", "i-0a0000000000000a1", "10.1.2.3", logical="compute-1")
BUSY = node("compute", "i-0b0000000000000b2", "10.1.2.4", logical="compute-2")
IN_GROUP = {"ClusterName": CLUSTER, "InstanceGroupNameContains": "compute"}
OPERATION = "0f1e2d3c-4b5a-4968-8776-655443322110"
CREATED = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)


def expect_group(stub, nodes=(IDLE, BUSY), *, continuous=True):
    stub.add_response("describe_cluster", cluster_reply(continuous=continuous), {"ClusterName": CLUSTER})
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": list(nodes)}, IN_GROUP)


def expect_controller_session(stub, session_tools):
    """The controller's node listed, then its SSM session answers: the compute node ip-10-1-2-4 runs job 7."""
    everyone = {"ClusterNodeSummaries": [CONTROLLER, IDLE, BUSY]}
    stub.add_response("list_cluster_nodes", everyone, {"ClusterName": CLUSTER})
    session_tools.replay_session(
        f"{JOB_TAG} 7 compute RUNNING",
        f"{NODE_TAG} ip-10-1-2-3 compute idle",
        f"{NODE_TAG} ip-10-1-2-4 compute allocated",
        f"{VERSION_TAG} slurm 24.11.5",
    )


def test_scale_up_adds_the_missing_nodes(stub, hpctl):
    expect_group(stub, nodes=[IDLE])
    stub.add_response(
        "batch_add_cluster_nodes",
        {"Successful": [], "Failed": []},
        {"ClusterName": CLUSTER, "NodesToAdd": [{"InstanceGroupName": "compute", "IncrementTargetCountBy": 3}]},
    )
    code, out, err = hpctl("scale", "compute", "4", "--yes")
    assert code == 0, err
    assert "add 3 node(s) to group compute" in out and "hpctl operations --follow" in out


def test_scale_down_removes_an_idle_node_and_keeps_the_busy_one(stub, hpctl, session_tools):
    expect_group(stub)
    expect_controller_session(stub, session_tools)
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [IDLE, BUSY]}, IN_GROUP)
    stub.add_response(
        "batch_delete_cluster_nodes",
        {"Successful": [IDLE["InstanceId"]]},
        {"ClusterName": CLUSTER, "NodeIds": [IDLE["InstanceId"]]},
    )
    code, out, err = hpctl("scale", "compute", "1", "--yes")
    assert code == 0, err
    assert "remove 1 node(s) of group compute" in out and "ip-10-1-2-3" in out
    assert "squeue" in " ".join(session_tools.calls())  # Slurm was asked on the controller


def test_scale_down_refuses_to_remove_a_busy_node_naming_it(stub, hpctl, session_tools):
    expect_group(stub)
    expect_controller_session(stub, session_tools)
    code, _, err = hpctl("scale", "compute", "0", "--yes")
    assert code == 2
    assert "ip-10-1-2-4, which runs a job" in err and "--force" in err  # no delete request was stubbed or sent


def test_scale_down_with_force_removes_the_busy_node_too(stub, hpctl, session_tools):
    expect_group(stub)
    expect_controller_session(stub, session_tools)
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [IDLE, BUSY]}, IN_GROUP)
    both = [IDLE["InstanceId"], BUSY["InstanceId"]]
    stub.add_response("batch_delete_cluster_nodes", {"Successful": both}, {"ClusterName": CLUSTER, "NodeIds": both})
    code, out, err = hpctl("scale", "compute", "0", "--force", "--yes")
    assert code == 0, err
    assert "ip-10-1-2-3, ip-10-1-2-4" in out


def test_scale_needs_continuous_provisioning_and_a_known_group(stub, hpctl):
    expect_group(stub, nodes=[IDLE], continuous=False)
    code, _, err = hpctl("scale", "compute", "2", "--yes")
    assert code == 2 and "provisioning = continuous" in err
    stub.add_response("describe_cluster", cluster_reply(), {"ClusterName": CLUSTER})
    stub.add_response(
        "list_cluster_nodes", {"ClusterNodeSummaries": []}, {**IN_GROUP, "InstanceGroupNameContains": "gpu"}
    )
    code, _, err = hpctl("scale", "gpu", "2", "--yes")
    assert code == 2 and "no instance group gpu" in err and "controller, compute" in err


def summary(status: str) -> dict:
    return {"OperationId": OPERATION, "ClusterArn": ARN, "Type": "Scaling", "Status": status, "CreationTime": CREATED}


LISTING = {"ClusterName": CLUSTER, "SortBy": "CreationTime", "SortOrder": "Descending", "MaxResults": 20}


def test_operations_lists_the_scaling_and_follows_it_to_done(stub, hpctl):
    stub.add_response("describe_cluster", cluster_reply(), {"ClusterName": CLUSTER})
    stub.add_response("list_cluster_operations", {"ClusterOperationSummaries": [summary("InProgress")]}, LISTING)
    scaling = {
        "InstanceGroupName": "compute",
        "Status": "InProgress",
        "Original": {"CurrentCount": 1, "TargetCount": 1},
        "Desired": {"TargetCount": 4},
    }
    stub.add_response(
        "describe_cluster_operation",
        {**summary("InProgress"), "ScalingDetails": [scaling]},
        {"ClusterName": CLUSTER, "OperationId": OPERATION},
    )
    stub.add_response("list_cluster_operations", {"ClusterOperationSummaries": [summary("InProgress")]}, LISTING)
    stub.add_response("list_cluster_operations", {"ClusterOperationSummaries": [summary("Done")]}, LISTING)
    code, out, err = hpctl("operations", "--follow", "--interval", "0.01")
    assert code == 0, err
    assert "compute 1->4 (InProgress)" in out
    assert f"{OPERATION} Scaling InProgress -> Done" in out and out.rstrip().endswith("no operation in progress")


def test_operations_without_any(stub, hpctl):
    stub.add_response("describe_cluster", cluster_reply(), {"ClusterName": CLUSTER})
    stub.add_response("list_cluster_operations", {"ClusterOperationSummaries": []}, LISTING)
    code, out, _ = hpctl("operations", "--follow")
    assert code == 0 and "no cluster operations yet" in out


def test_a_refused_add_is_one_line_naming_the_group_and_hyperpods_error(stub, hpctl):
    """BatchAddClusterNodes answers 200 with a Failed list: read, never taken for success."""
    expect_group(stub, nodes=[IDLE])
    failed = {"InstanceGroupName": "compute", "ErrorCode": "InvalidInstanceGroupStatus", "FailedCount": 3}
    stub.add_response(
        "batch_add_cluster_nodes",
        {"Successful": [], "Failed": [{**failed, "Message": "the group is updating"}]},
        {"ClusterName": CLUSTER, "NodesToAdd": [{"InstanceGroupName": "compute", "IncrementTargetCountBy": 3}]},
    )
    code, out, err = hpctl("scale", "compute", "4", "--yes")
    assert code != 0 and "requested" not in out
    assert "refused to add nodes to group compute" in err and "InvalidInstanceGroupStatus" in err, err


def test_a_refused_delete_is_one_line_naming_the_node(stub, hpctl, session_tools):
    expect_group(stub)
    expect_controller_session(stub, session_tools)
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [IDLE, BUSY]}, IN_GROUP)
    refusal = {"Code": "InvalidNodeStatus", "Message": "node is updating", "NodeId": IDLE["InstanceId"]}
    stub.add_response(
        "batch_delete_cluster_nodes", {"Failed": [refusal]}, {"ClusterName": CLUSTER, "NodeIds": [IDLE["InstanceId"]]}
    )
    code, out, err = hpctl("scale", "compute", "1", "--yes")
    assert code != 0 and "requested" not in out
    assert "refused to remove 1 of 1 node(s) of group compute: ip-10-1-2-3: InvalidNodeStatus" in err, err
