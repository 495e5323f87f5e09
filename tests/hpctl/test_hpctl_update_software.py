"""`hpctl update-software`: UpdateClusterSoftware through botocore's Stubber (each request checked against the
sagemaker model), what Slurm runs from the controller's SSM session as the recorder replays it."""

from tests.hpctl.conftest import CLUSTER
from tests.hpctl.test_hpctl_nodes import ARN, CONTROLLER, GOOD, group
from tests.hpctl.test_hpctl_nodes import stub as stub  # the fixture: the sagemaker client behind a Stubber

ROLLING = {
    "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
    "WaitIntervalInSeconds": 300,
}


def expect_cluster_and_queue(stub, session_tools, *jobs: str):
    compute = {
        **group("compute", "ml.trn1.32xlarge", 2),
        "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["trn1"]},
        "CurrentImageReleaseVersion": "2025.11.3",
        "ImageVersionStatus": "SecurityUpdateRequired",
    }
    reply = {
        "ClusterArn": ARN,
        "ClusterName": CLUSTER,
        "ClusterStatus": "InService",
        "NodeProvisioningMode": "Continuous",
        "InstanceGroups": [group("controller", "ml.c5.xlarge", 1), compute],
    }
    stub.add_response("describe_cluster", reply, {"ClusterName": CLUSTER})
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [CONTROLLER, GOOD]}, {"ClusterName": CLUSTER})
    session_tools.replay_session(*jobs, "hpl-version slurm 24.11.5")


def test_a_group_updates_rolling_one_node_at_a_time_with_rollback_alarms(stub, hpctl, session_tools):
    expect_cluster_and_queue(stub, session_tools, "hpl-job 3 other-partition RUNNING")
    request = {
        "ClusterName": CLUSTER,
        "InstanceGroups": [{"InstanceGroupName": "compute"}],
        "DeploymentConfig": {**ROLLING, "AutoRollbackConfiguration": [{"AlarmName": "hpl-node-health"}]},
    }
    stub.add_response("update_cluster_software", {"ClusterArn": ARN}, request)
    code, out, err = hpctl("update-software", "--group", "compute", "--rollback-alarm", "hpl-node-health", "--yes")
    assert code == 0, err
    assert "software update started for compute" in out


def test_a_run_on_the_group_refuses_the_update_unless_forced(stub, hpctl, session_tools):
    expect_cluster_and_queue(stub, session_tools, "hpl-job 41 trn1 RUNNING", "hpl-job 42 trn1 PENDING")
    code, _, err = hpctl("update-software", "--group", "compute", "--yes")
    assert code == 2
    assert "group compute has jobs 41 (running), 42 (pending)" in err and "--force" in err
    expect_cluster_and_queue(stub, session_tools, "hpl-job 41 trn1 RUNNING")
    stub.add_response(
        "update_cluster_software",
        {"ClusterArn": ARN},
        {"ClusterName": CLUSTER, "InstanceGroups": [{"InstanceGroupName": "compute"}], "DeploymentConfig": ROLLING},
    )
    code, _, err = hpctl("update-software", "--group", "compute", "--force", "--yes")
    assert code == 0, err


def test_the_whole_cluster_waits_for_every_job_since_the_controller_restarts(stub, hpctl, session_tools):
    expect_cluster_and_queue(stub, session_tools, "hpl-job 7 other-partition PENDING")
    code, _, err = hpctl("update-software", "--yes")
    assert code == 2 and "group controller has jobs 7 (pending)" in err
    expect_cluster_and_queue(stub, session_tools)
    stub.add_response(
        "update_cluster_software", {"ClusterArn": ARN}, {"ClusterName": CLUSTER, "DeploymentConfig": ROLLING}
    )
    code, out, err = hpctl("update-software", "--yes")
    assert code == 0, err
    assert "controller, compute" in out


def test_an_unknown_group_is_named(stub, hpctl):
    stub.add_response(
        "describe_cluster",
        {
            "ClusterArn": ARN,
            "ClusterName": CLUSTER,
            "ClusterStatus": "InService",
            "InstanceGroups": [group("controller", "ml.c5.xlarge", 1)],
        },
        {"ClusterName": CLUSTER},
    )
    code, _, err = hpctl("update-software", "--group", "gpu", "--yes")
    assert code == 2 and "no instance group gpu (groups: controller)" in err
