"""After a failed first create: the cluster and the outputs are gone, the nodes' logs are not."""

from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.exceptions import ClientError

from hpctl.observe.lifecycle_logs import MAX_STREAMS_PER_FILTER, show_lifecycle_logs

# Within CloudWatch's window for new events (14 days), whole seconds.
EARLIER = (datetime.now(timezone.utc) - timedelta(days=3)).replace(microsecond=0)
CLUSTER = "hpl-test-cluster"  # the deployment fixture's cluster


@pytest.fixture
def write_group(log_group_created):
    def write(logs, group: str, streams: dict[str, list[str]], *, created: datetime) -> None:
        logs.create_log_group(logGroupName=group)
        log_group_created(group, created)
        _fill(logs, group, streams, created)

    return write


def _fill(logs, group: str, streams: dict[str, list[str]], created: datetime) -> None:
    stamp = int(created.timestamp() * 1000)
    for stream, lines in streams.items():
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": stamp + index, "message": line} for index, line in enumerate(lines)],
        )


@pytest.fixture
def rolled_back(deployed, write_group):
    """Two failed creates of the same cluster name: one group per CreateCluster, the newest last."""
    logs = boto3.client("logs", region_name=deployed.region)
    prefix = f"/aws/sagemaker/Clusters/{CLUSTER}/"
    write_group(logs, prefix + "oldid1234567", {"LifecycleConfig/compute/i-old": ["old attempt"]}, created=EARLIER)
    write_group(
        logs,
        prefix + "newid7654321",
        {"LifecycleConfig/compute/i-new": ["[hyperpod-lora] ERROR in step wait-fsx: /fsx is not mounted"]},
        created=EARLIER + timedelta(days=1),
    )
    # Another cluster whose name starts the same way must not be taken for ours.
    write_group(
        logs,
        f"/aws/sagemaker/Clusters/{CLUSTER}-2/otherid",
        {"LifecycleConfig/compute/i-x": ["x"]},
        created=EARLIER + timedelta(days=2),
    )
    deployed.roll_back_first_create()
    return deployed


def test_lifecycle_logs_after_the_first_create_rolled_back(rolled_back, hpctl):
    code, out, err = hpctl("logs", "lifecycle")
    assert code == 0, err
    assert out.splitlines()[-1].endswith("ERROR in step wait-fsx: /fsx is not mounted")
    assert "old attempt" not in out
    assert err.startswith(
        f"note: cluster {CLUSTER} does not exist (a failed create rolls it back); showing its newest log group "
        f"/aws/sagemaker/Clusters/{CLUSTER}/newid7654321 (created {EARLIER + timedelta(days=1):%Y-%m-%d %H:%M:%S} UTC, "
        "2 under "
    )


def test_stack_deleted_too_names_the_cluster_option(rolled_back, hpctl):
    boto3.client("cloudformation", region_name=rolled_back.region).delete_stack(StackName=rolled_back.stack)
    code, _, err = hpctl("logs", "lifecycle")
    assert code == 2
    assert "`hpctl logs lifecycle --cluster <name_prefix>-cluster`" in err
    code, out, _ = hpctl("logs", "lifecycle", "--cluster", CLUSTER)
    assert code == 0 and "ERROR in step wait-fsx" in out


def test_no_log_group_at_all(deployed, hpctl):
    deployed.roll_back_first_create()
    code, _, err = hpctl("logs", "lifecycle")
    assert code == 2
    assert err == (
        f"error: cluster {CLUSTER} does not exist in us-west-2 and left no log group under "
        f"/aws/sagemaker/Clusters/{CLUSTER}/: its creation never reached the nodes; "
        "`hpctl wait` shows the stack's events\n"
    )


def test_follow_more_streams_than_one_filter_call_takes(deployed, write_group, capsys):
    """256 compute nodes are allowed; FilterLogEvents takes at most 100 stream names per call."""
    session = boto3.Session(region_name=deployed.region)
    limit = (
        session.client("logs")
        .meta.service_model.operation_model("FilterLogEvents")
        .input_shape.members["logStreamNames"]
        .metadata["max"]
    )
    assert limit == MAX_STREAMS_PER_FILTER
    calls = []

    def enforce_limit(params, **_):  # the service's check, which moto does not make
        names = params.get("logStreamNames", [])
        calls.append(len(names))
        if len(names) > limit:
            raise ClientError(
                {"Error": {"Code": "InvalidParameterException", "Message": "logStreamNames: at most 100"}},
                "FilterLogEvents",
            )

    session.events.register("provide-client-params.logs.FilterLogEvents", enforce_limit)
    logs = session.client("logs")
    group = f"/aws/sagemaker/Clusters/{CLUSTER}/{deployed.cluster_id}"
    nodes = [f"compute/i-{index:04d}" for index in range(150)]
    write_group(logs, group, {f"LifecycleConfig/{node}": ["started"] for node in nodes}, created=EARLIER)

    def sleep(_):
        if len(calls) == 2:  # after the first poll, the last node writes; the second poll must show it
            logs.put_log_events(
                logGroupName=group,
                logStreamName=f"LifecycleConfig/{nodes[-1]}",
                logEvents=[{"timestamp": int(EARLIER.timestamp() * 1000) + 50, "message": "lifecycle done"}],
            )
        else:
            raise KeyboardInterrupt

    show_lifecycle_logs(session, group, node=None, tail=1, follow=True, interval_s=1, sleep=sleep)
    out = capsys.readouterr().out.splitlines()
    assert calls == [100, 50, 100, 50]
    assert out[-2] == f"[{nodes[-1]}] {EARLIER:%Y-%m-%d %H:%M:%S}  lifecycle done"
