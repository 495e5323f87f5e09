"""`hpctl nodes`, `node reboot|replace`, `health-check` and `events`: the stack comes from moto, HyperPod's
node API from botocore's Stubber, which checks every request against botocore's sagemaker model (names,
types, patterns, list bounds) before it answers, and every answer against the model's output shape."""

import io
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from llm_pipeline.run_files import ALERTS_FILE, AlertLine
from tests.hpctl.conftest import BUCKET, CLUSTER, REGION

ARN = f"arn:aws:sagemaker:{REGION}:123456789012:cluster/abcdef123456"
LAUNCH = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


class Terminal(io.StringIO):
    """Typed answers at a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def stub(deployed, monkeypatch):
    """The sagemaker client every hpctl session hands out, behind a Stubber; other services stay on moto."""
    client = boto3.Session(region_name=REGION).client("sagemaker")
    stubber = Stubber(client)
    original = boto3.session.Session.client

    def make_client(self, service, *args, **kwargs):
        return client if service == "sagemaker" else original(self, service, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "client", make_client)
    monkeypatch.setattr("sys.stdin", io.StringIO())  # no terminal unless a test gives one
    with stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def group(name, instance_type, count):
    return {"InstanceGroupName": name, "InstanceType": instance_type, "CurrentCount": count, "TargetCount": count}


def cluster_reply(*, continuous=True, groups=None):
    reply = {
        "ClusterArn": ARN,
        "ClusterName": CLUSTER,
        "ClusterStatus": "InService",
        "InstanceGroups": groups or [group("controller", "ml.c5.xlarge", 1), group("compute", "ml.trn1.32xlarge", 2)],
    }
    return reply | ({"NodeProvisioningMode": "Continuous"} if continuous else {})


def node(group_name, instance_id, ip, *, status="Running", message="", logical=None, instance_type="ml.trn1.32xlarge"):
    summary = {
        "InstanceGroupName": group_name,
        "InstanceId": instance_id,
        "InstanceType": instance_type,
        "LaunchTime": LAUNCH,
        "InstanceStatus": {"Status": status} | ({"Message": message} if message else {}),
        "PrivateDnsHostname": f"ip-{ip.replace('.', '-')}.{REGION}.compute.internal",
    }
    return summary | ({"NodeLogicalId": logical} if logical else {})


CONTROLLER = node(
    "controller", "i-0c0000000000000c0", "10.1.0.10", logical="controller-0", instance_type="ml.c5.xlarge"
)
GOOD = node("compute", "i-0a0000000000000a1", "10.1.2.3", logical="compute-1")
BAD = node(
    "compute", "i-0b0000000000000b2", "10.1.2.4", status="Failure", message="GPU fell off the bus", logical="compute-2"
)


def expect_cluster(stub, *, continuous=True, nodes=(CONTROLLER, GOOD, BAD), groups=None):
    stub.add_response("describe_cluster", cluster_reply(continuous=continuous, groups=groups), {"ClusterName": CLUSTER})
    listing = {"ClusterName": CLUSTER} | ({"IncludeNodeLogicalIds": True} if continuous else {})
    if nodes is not None:
        stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": list(nodes)}, listing)


def test_nodes_lists_slurm_name_instance_group_state_and_health(stub, hpctl):
    expect_cluster(stub)
    code, out, _ = hpctl("nodes")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"cluster {CLUSTER} (InService, continuous provisioning)"
    assert lines[1].split() == ["SLURM", "NAME", "INSTANCE", "LOGICAL", "ID", "GROUP", "STATE", "HEALTH"]
    rows = [line.split(None, 5) for line in lines[2:]]
    assert rows == [
        ["ip-10-1-2-3", "i-0a0000000000000a1", "compute-1", "compute", "Running", "ok"],
        ["ip-10-1-2-4", "i-0b0000000000000b2", "compute-2", "compute", "Failure", "failed: GPU fell off the bus"],
        ["ip-10-1-0-10", "i-0c0000000000000c0", "controller-0", "controller", "Running", "ok"],
    ]


def test_reboot_in_continuous_mode_sends_logical_ids(stub, hpctl):
    expect_cluster(stub)
    stub.add_response(
        "batch_reboot_cluster_nodes",
        {"SuccessfulNodeLogicalIds": ["compute-2", "compute-1"]},
        {"ClusterName": CLUSTER, "NodeLogicalIds": ["compute-2", "compute-1"]},
    )
    code, out, _ = hpctl("node", "reboot", "ip-10-1-2-4", "i-0a0000000000000a1", "ip-10-1-2-4", "--yes")
    assert code == 0
    assert out.splitlines()[:2] == ["reboot started: compute-2", "reboot started: compute-1"]


def test_replace_in_standard_mode_sends_instance_ids_and_reports_refusals(stub, hpctl):
    expect_cluster(stub, continuous=False)
    stub.add_response(
        "batch_replace_cluster_nodes",
        {
            "Successful": ["i-0b0000000000000b2"],
            "Failed": [
                {"NodeId": "i-0a0000000000000a1", "ErrorCode": "InvalidInstanceStatus", "Message": "node is busy"}
            ],
        },
        {"ClusterName": CLUSTER, "NodeIds": ["i-0b0000000000000b2", "i-0a0000000000000a1"]},
    )
    code, _, err = hpctl("node", "replace", "compute-2", "ip-10-1-2-3", "-y")
    assert code == 1
    assert "replace started: i-0b0000000000000b2" in err
    assert "replace refused for i-0a0000000000000a1: InvalidInstanceStatus: node is busy" in err


def test_more_than_25_nodes_go_in_batches(stub, hpctl):
    many = [node("compute", f"i-{index:017x}", f"10.1.3.{index}") for index in range(1, 28)]
    expect_cluster(stub, continuous=False, nodes=many)
    ids = [item["InstanceId"] for item in many]
    for batch in (ids[:25], ids[25:]):
        stub.add_response(
            "batch_reboot_cluster_nodes", {"Successful": batch}, {"ClusterName": CLUSTER, "NodeIds": batch}
        )
    code, out, _ = hpctl("node", "reboot", *[f"ip-10-1-3-{index}" for index in range(1, 28)], "--yes")
    assert code == 0 and out.count("reboot started: ") == 27


def test_acting_without_a_terminal_needs_yes(stub, hpctl):
    expect_cluster(stub)
    code, _, err = hpctl("node", "replace", "ip-10-1-2-4")
    assert code == 2
    assert err.startswith("error: replace 1 node(s) of cluster hpl-test-cluster: ip-10-1-2-4 (compute); ")
    assert "wipes their root and secondary volumes" in err and err.rstrip().endswith("rerun with --yes")


def test_a_no_at_the_terminal_changes_nothing(stub, hpctl, monkeypatch):
    expect_cluster(stub)
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    code, out, err = hpctl("node", "reboot", "ip-10-1-0-10")
    assert code == 2 and "cancelled: nothing was changed" in err
    assert "controller holds the Slurm controller" in out and out.rstrip().endswith("[y/N]")


def test_a_yes_at_the_terminal_acts(stub, hpctl, monkeypatch):
    expect_cluster(stub)
    stub.add_response(
        "batch_reboot_cluster_nodes",
        {"SuccessfulNodeLogicalIds": ["compute-1"]},
        {"ClusterName": CLUSTER, "NodeLogicalIds": ["compute-1"]},
    )
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    code, out, _ = hpctl("node", "reboot", "compute-1")
    assert code == 0 and "reboot started: compute-1" in out


def test_unknown_node_names_the_known_ones(stub, hpctl):
    expect_cluster(stub)
    code, _, err = hpctl("node", "reboot", "ip-10-9-9-9", "--yes")
    assert code == 2
    assert "no node ip-10-9-9-9 in cluster hpl-test-cluster (nodes: ip-10-1-2-3, ip-10-1-2-4, ip-10-1-0-10)" in err


def test_health_check_defaults_to_the_accelerated_groups_and_two_checks(stub, hpctl):
    expect_cluster(stub, nodes=None)
    stub.add_response(
        "start_cluster_health_check",
        {"ClusterArn": ARN},
        {
            "ClusterName": CLUSTER,
            "DeepHealthCheckConfigurations": [
                {"InstanceGroupName": "compute", "DeepHealthChecks": ["InstanceStress", "InstanceConnectivity"]}
            ],
        },
    )
    code, out, _ = hpctl("health-check", "--yes")
    assert code == 0
    assert out.startswith("deep health check (InstanceStress, InstanceConnectivity) started on compute")


def test_health_check_of_a_named_group_with_chosen_checks(stub, hpctl):
    groups = [
        group("controller", "ml.c5.xlarge", 1),
        group("gpu", "ml.p5.48xlarge", 2),
        group("cpu", "ml.m5.xlarge", 1),
    ]
    expect_cluster(stub, nodes=None, groups=groups)
    stub.add_response(
        "start_cluster_health_check",
        {"ClusterArn": ARN},
        {
            "ClusterName": CLUSTER,
            "DeepHealthCheckConfigurations": [{"InstanceGroupName": "cpu", "DeepHealthChecks": ["InstanceStress"]}],
        },
    )
    code, _, _ = hpctl("health-check", "cpu", "--check", "InstanceStress", "--check", "InstanceStress", "--yes")
    assert code == 0


def test_health_check_refuses_an_unknown_group_and_a_cluster_without_accelerators(stub, hpctl):
    expect_cluster(stub, nodes=None)
    code, _, err = hpctl("health-check", "gpu", "--yes")
    assert code == 2 and "no instance group gpu in cluster hpl-test-cluster (groups: controller, compute)" in err
    expect_cluster(stub, nodes=None, groups=[group("controller", "ml.c5.xlarge", 1), group("cpu", "ml.m5.xlarge", 2)])
    code, _, err = hpctl("health-check", "--yes")
    assert code == 2 and "has no GPU or Trainium group" in err


def event(minutes, description, *, level="Info", group_name=None, instance=None):
    item = {
        "EventId": f"0000000{minutes}-0000-0000-0000-000000000000",
        "ClusterArn": ARN,
        "ClusterName": CLUSTER,
        "ResourceType": "Instance" if instance else ("InstanceGroup" if group_name else "Cluster"),
        "EventTime": LAUNCH + timedelta(minutes=minutes),
        "Description": description,
        "EventLevel": level,
    }
    return (
        item
        | ({"InstanceGroupName": group_name} if group_name else {})
        | ({"InstanceId": instance} if instance else {})
    )


def test_events_newest_pages_printed_oldest_first(stub, hpctl):
    expect_cluster(stub, nodes=None)
    query = {"ClusterName": CLUSTER, "SortBy": "EventTime", "SortOrder": "Descending"}
    stub.add_response(
        "list_cluster_events",
        {
            "Events": [
                event(3, "node replaced", level="Warn", group_name="compute", instance="i-0b0000000000000b2"),
                event(2, "scaling compute to 2", group_name="compute"),
            ],
            "NextToken": "page-2",
        },
        query | {"MaxResults": 3},
    )
    stub.add_response(
        "list_cluster_events",
        {"Events": [event(1, "cluster created")], "NextToken": "page-3"},
        query | {"MaxResults": 1, "NextToken": "page-2"},
    )
    code, out, _ = hpctl("events", "--limit", "3")
    assert code == 0
    assert [line.split(None, 4)[2:] for line in out.splitlines()[1:]] == [
        ["Info", "Cluster", "cluster created"],
        ["Info", "compute", "scaling compute to 2"],
        ["Warn", "compute/i-0b0000000000000b2", "node replaced"],
    ]


def test_events_of_one_node_by_slurm_name(stub, hpctl):
    expect_cluster(stub)
    stub.add_response(
        "list_cluster_events",
        {"Events": []},
        {
            "ClusterName": CLUSTER,
            "SortBy": "EventTime",
            "SortOrder": "Descending",
            "InstanceGroupName": "compute",
            "NodeId": "i-0b0000000000000b2",
            "MaxResults": 50,
        },
    )
    code, out, _ = hpctl("events", "--group", "compute", "--node", "ip-10-1-2-4")
    assert code == 0 and out.strip() == f"no events for cluster {CLUSTER}"


def test_events_need_continuous_provisioning(stub, hpctl):
    expect_cluster(stub, continuous=False, nodes=None)
    code, _, err = hpctl("events")
    assert code == 2 and "uses standard provisioning: HyperPod records cluster events only with continuous" in err


def test_events_follow_interleaves_a_runs_alerts_and_prints_only_new_rows(stub, hpctl, monkeypatch):
    s3 = boto3.client("s3", region_name=REGION)
    key = f"outputs/run-a/logs/{ALERTS_FILE}"

    def alert(minutes: int, state: str, detail: str) -> str:
        time = (LAUNCH + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return AlertLine(time, "/fsx/outputs/run-a", "train", "12", state, detail).to_json()

    s3.put_object(Bucket=BUCKET, Key=key, Body=alert(2, "stalled", "no progress line for 30.0 min").encode())
    expect_cluster(stub, nodes=None)
    query = {"ClusterName": CLUSTER, "SortBy": "EventTime", "SortOrder": "Descending", "MaxResults": 50}
    replaced = event(3, "node replaced", level="Warn", group_name="compute", instance="i-0b0000000000000b2")
    stub.add_response("list_cluster_events", {"Events": [event(1, "cluster created")]}, query)
    stub.add_response("list_cluster_events", {"Events": [replaced, event(1, "cluster created")]}, query)
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt  # Ctrl-C: the follow ends quietly
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
        s3.put_object(
            Bucket=BUCKET, Key=key, Body=(body + alert(4, "finished", "the last step, generate, completed")).encode()
        )

    monkeypatch.setattr("hpctl.nodes.commands.time.sleep", sleep)
    code, out, _ = hpctl("events", "--run", "run-a", "--follow", "--every", "5")
    assert code == 0 and sleeps == [5, 5]
    rows = [line.split(None, 4)[2:] for line in out.splitlines()[1:]]
    assert rows == [
        ["Info", "Cluster", "cluster created"],
        ["Warn", "run:run-a/train", "stalled: no progress line for 30.0 min"],
        ["Warn", "compute/i-0b0000000000000b2", "node replaced"],
        ["Info", "run:run-a/train", "finished: the last step, generate, completed"],
    ]
