"""`hpctl wait`: polls the stack, then the cluster, until InService; stops on failure or timeout."""

import boto3
import botocore.session
import pytest

from hpctl.cluster.wait import wait_in_service
from hpctl.common.errors import HpctlError
from hpctl.common.stack import deploy_failed

# Every stack status CloudFormation has, from botocore's service model (not retyped).
STACK_STATUSES = botocore.session.get_session().get_service_model("cloudformation").shape_for("StackStatus").enum


def session(deployed):
    return boto3.Session(region_name=deployed.region)


def test_follows_a_creating_cluster_until_in_service(deployed, capsys):
    deployed.set_cluster(status="Creating")
    polls = []

    def sleep(seconds):  # between polls the cluster moves on, as HyperPod's would
        polls.append(seconds)
        if len(polls) == 2:
            deployed.set_cluster(status="InService")

    cluster = wait_in_service(session(deployed), deployed.stack, timeout_s=600, interval_s=30, sleep=sleep)
    assert cluster.status == "InService" and polls == [30, 30]
    progress = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert progress == [f"cluster {deployed.cluster} Creating (nodes controller 1/1, compute 1/1)"] * 2 + [
        f"cluster {deployed.cluster} InService (nodes controller 1/1, compute 1/1)"
    ]


def test_follows_the_deploy_before_the_cluster_is_named(bare_stack, capsys):
    bare_stack.create({}, status="CREATE_IN_PROGRESS")

    def sleep(seconds):  # the deploy finishes: outputs appear, naming a cluster that is in service
        bare_stack.finish_deploy()

    cluster = wait_in_service(
        boto3.Session(region_name="us-west-2"), "HplTestStack", timeout_s=600, interval_s=30, sleep=sleep
    )
    assert cluster.status == "InService"
    out = capsys.readouterr().out
    assert "stack HplTestStack CREATE_IN_PROGRESS (the cluster is named once the deploy finishes)" in out


def test_waits_for_a_deploy_that_has_not_created_the_stack_yet(bare_stack, capsys):
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 2:
            bare_stack.create({}, status="CREATE_IN_PROGRESS")
        if len(polls) == 3:
            bare_stack.finish_deploy()

    cluster = wait_in_service(
        boto3.Session(region_name="us-west-2"), "HplTestStack", timeout_s=600, interval_s=30, sleep=sleep
    )
    assert cluster.status == "InService"
    progress = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert progress[:3] == ["stack HplTestStack not created yet in us-west-2"] * 2 + [
        "stack HplTestStack CREATE_IN_PROGRESS (the cluster is named once the deploy finishes)"
    ]


def test_wrong_region_times_out_naming_the_region(deployed, hpctl):
    code, out, err = hpctl("wait", "--region", "eu-west-1", "--timeout", "0.001", "--interval", "0.001")
    assert code == 2
    assert "stack HplTestStack not created yet in eu-west-1" in out
    assert err.startswith("error: not in service after 0.001 s (last: stack HplTestStack not created yet in eu-west-1)")


def test_failed_cluster_stops_with_the_reason(deployed, hpctl):
    deployed.set_cluster(status="Failed", failure="InsufficientInstanceCapacity for ml.trn1.32xlarge")
    code, _, err = hpctl("wait", "--interval", "1")
    assert code == 1
    assert err == f"error: cluster {deployed.cluster} failed: InsufficientInstanceCapacity for ml.trn1.32xlarge\n"


def test_gives_up_after_the_timeout(deployed):
    deployed.set_cluster(status="Creating")
    slept = []
    with pytest.raises(HpctlError, match=r"not in service after 0 s \(last: cluster hpl-test-cluster Creating"):
        wait_in_service(session(deployed), deployed.stack, timeout_s=0, interval_s=30, sleep=slept.append)
    assert slept == []


def test_in_service_at_once(deployed, hpctl):
    code, out, _ = hpctl("wait")
    assert code == 0
    assert (
        out.splitlines()[-1]
        == f"cluster {deployed.cluster} is in service: `hpctl shell` opens a shell on the controller"
    )


def test_interval_and_timeout_must_be_positive(deployed, hpctl, capsys):
    with pytest.raises(SystemExit) as stop:
        hpctl("wait", "--timeout", "0")
    assert stop.value.code == 2
    assert "argument --timeout: must be greater than 0, got 0" in capsys.readouterr().err


def test_shows_the_stack_events_while_the_first_deploy_creates(bare_stack, add_stack_event, capsys):
    bare_stack.create({}, status="CREATE_IN_PROGRESS")
    add_stack_event("HplTestStack", "FsxFileSystem", "AWS::FSx::FileSystem", "CREATE_IN_PROGRESS")
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            add_stack_event("HplTestStack", "FsxFileSystem", "AWS::FSx::FileSystem", "CREATE_COMPLETE")
            add_stack_event("HplTestStack", "HyperPodCluster", "AWS::SageMaker::Cluster", "CREATE_IN_PROGRESS")
        if len(polls) == 2:
            bare_stack.finish_deploy()

    cluster = wait_in_service(
        boto3.Session(region_name="us-west-2"), "HplTestStack", timeout_s=600, interval_s=30, sleep=sleep
    )
    assert cluster.status == "InService"
    lines = capsys.readouterr().out.splitlines()
    events = [" ".join(line.split()[1:]) for line in lines if line.startswith("  ")]
    assert events == [
        "CREATE_IN_PROGRESS AWS::CloudFormation::Stack HplTestStack (User Initiated)",
        "CREATE_IN_PROGRESS AWS::FSx::FileSystem FsxFileSystem",
        "CREATE_COMPLETE AWS::FSx::FileSystem FsxFileSystem",
        "CREATE_IN_PROGRESS AWS::SageMaker::Cluster HyperPodCluster",
    ], "each event once, oldest first, only while the deploy runs"


def test_a_failed_create_stops_with_the_first_cause(bare_stack, add_stack_event, hpctl):
    bare_stack.create({}, status="CREATE_IN_PROGRESS")
    reason = "Resource handler returned message: lifecycle script failed on compute"
    add_stack_event("HplTestStack", "HyperPodCluster", "AWS::SageMaker::Cluster", "CREATE_FAILED", reason)
    add_stack_event("HplTestStack", "FsxLink", "AWS::FSx::DataRepositoryAssociation", "CREATE_FAILED", "cancelled")
    bare_stack.set_status("ROLLBACK_IN_PROGRESS")
    code, out, err = hpctl("wait", "--interval", "1")
    assert code == 1
    assert f"CREATE_FAILED AWS::SageMaker::Cluster HyperPodCluster ({reason})" in out
    assert err.startswith(
        f"error: stack HplTestStack is ROLLBACK_IN_PROGRESS: HyperPodCluster (AWS::SageMaker::Cluster) "
        f"CREATE_FAILED: {reason}. `hpctl logs lifecycle` shows the nodes' setup logs"
    )
    assert "--no-rollback" in err


def start_update(deployed, add_stack_event):
    """An update has begun: the stack's own UPDATE_IN_PROGRESS event, as CloudFormation writes it."""
    add_stack_event(
        deployed.stack, deployed.stack, "AWS::CloudFormation::Stack", "UPDATE_IN_PROGRESS", "User Initiated"
    )
    deployed.set_stack_status("UPDATE_IN_PROGRESS")


@pytest.mark.parametrize("final", ["UPDATE_ROLLBACK_COMPLETE", "UPDATE_ROLLBACK_FAILED", "UPDATE_FAILED"])
def test_a_failed_update_exits_1_with_its_first_failed_event(deployed, add_stack_event, hpctl, final):
    """The old cluster is still in service after a rolled-back update: that is no success."""
    start_update(deployed, add_stack_event)
    reason = "Resource handler returned message: Storage capacity cannot be decreased"
    add_stack_event(deployed.stack, "FsxFileSystem", "AWS::FSx::FileSystem", "UPDATE_FAILED", reason)
    add_stack_event(deployed.stack, "HyperPodCluster", "AWS::SageMaker::Cluster", "UPDATE_FAILED", "cancelled")
    add_stack_event(deployed.stack, deployed.stack, "AWS::CloudFormation::Stack", "UPDATE_ROLLBACK_IN_PROGRESS")
    deployed.set_stack_status(final)
    code, out, err = hpctl("wait", "--interval", "1")
    assert code == 1
    assert f"UPDATE_FAILED AWS::FSx::FileSystem FsxFileSystem ({reason})" in out
    assert err.startswith(
        f"error: stack {deployed.stack} is {final}: FsxFileSystem (AWS::FSx::FileSystem) UPDATE_FAILED: {reason}."
    )


def test_an_update_in_progress_is_waited_for_although_the_cluster_serves(deployed, add_stack_event, capsys):
    start_update(deployed, add_stack_event)
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 2:
            deployed.set_stack_status("UPDATE_COMPLETE")

    cluster = wait_in_service(session(deployed), deployed.stack, timeout_s=600, interval_s=30, sleep=sleep)
    assert cluster.status == "InService" and polls == [30, 30]
    progress = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert progress[0].startswith(f"stack {deployed.stack} UPDATE_IN_PROGRESS, cluster {deployed.cluster} InService")
    assert progress[-1].startswith(f"cluster {deployed.cluster} InService")


def test_every_failed_or_rolled_back_status_counts_as_failed():
    """Of all CloudFormation's stack statuses, only these are a deploy going or gone right."""
    healthy = {
        "CREATE_IN_PROGRESS",
        "CREATE_COMPLETE",
        "DELETE_IN_PROGRESS",
        "DELETE_COMPLETE",
        "UPDATE_IN_PROGRESS",
        "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
        "UPDATE_COMPLETE",
        "REVIEW_IN_PROGRESS",
        "IMPORT_IN_PROGRESS",
        "IMPORT_COMPLETE",
    }
    assert healthy < set(STACK_STATUSES)
    assert {status for status in STACK_STATUSES if not deploy_failed(status)} == healthy


def set_group(deployed, name, **fields):
    """A group as DescribeCluster reports it in continuous mode (moto fills every group at once)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    cluster = sagemaker_backends[DEFAULT_ACCOUNT_ID][deployed.region].clusters[deployed.cluster]
    next(group for group in cluster.instance_groups if group["InstanceGroupName"] == name).update(fields)


def test_a_continuous_cluster_in_service_is_waited_for_until_each_group_has_its_nodes(deployed, capsys):
    """Continuous mode: InService once the controller is up, with compute 0 of 4; the wait goes on."""
    set_group(deployed, "compute", CurrentCount=0, TargetCount=4)
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        set_group(deployed, "compute", CurrentCount=2 * len(polls))

    cluster = wait_in_service(session(deployed), deployed.stack, timeout_s=600, interval_s=30, sleep=sleep)
    assert polls == [30, 30] and [group.current for group in cluster.groups] == [1, 4]
    progress = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert progress == [
        f"cluster {deployed.cluster} InService (nodes controller 1/1, compute 0/4); waiting for nodes: compute 0/4",
        f"cluster {deployed.cluster} InService (nodes controller 1/1, compute 2/4); waiting for nodes: compute 2/4",
        f"cluster {deployed.cluster} InService (nodes controller 1/1, compute 4/4)",
    ]


def test_a_group_with_a_minimum_is_ready_at_its_minimum(deployed, capsys):
    set_group(deployed, "compute", CurrentCount=2, TargetCount=4, MinCount=2)
    cluster = wait_in_service(session(deployed), deployed.stack, timeout_s=600, interval_s=30, sleep=pytest.fail)
    assert cluster.filling == ()
    out = capsys.readouterr().out
    assert out.endswith(f"cluster {deployed.cluster} InService (nodes controller 1/1, compute 2/4 (min 2))\n")


def test_nodes_that_never_come_time_out_naming_the_group(deployed):
    set_group(deployed, "compute", CurrentCount=1, TargetCount=3)
    with pytest.raises(HpctlError, match=r"not every group has its nodes after 0 s .*compute 1/3.*`hpctl events`"):
        wait_in_service(session(deployed), deployed.stack, timeout_s=0, interval_s=30, sleep=pytest.fail)
