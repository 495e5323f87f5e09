"""The run side of push alerts (llm_pipeline.jobs.alerts): what a step's end tells, the stall watch, the alerts file,
and the publish path against moto's SNS on a KMS-encrypted topic (a subscribed SQS queue receives the message)."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from llm_pipeline.jobs import alerts
from llm_pipeline.jobs.pipeline_status import write_record
from llm_pipeline.run_files import ALERTS_FILE, NAN_STOP_OPENING, AlertLine, ProgressLine, StepJob, StepLog

REGION = "us-west-2"


def progress(step: int) -> str:
    return ProgressLine(step, 10, 1.0, 1e-4, 1.0, 100.0, "0:00:10").format()


def test_published_alert_reaches_a_subscriber_of_the_encrypted_topic(tmp_path):
    with mock_aws():
        key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
        sns = boto3.client("sns", region_name=REGION)
        topic = sns.create_topic(Name="hyperpod-lora-alerts", Attributes={"KmsMasterKeyId": key})["TopicArn"]
        sqs = boto3.client("sqs", region_name=REGION)
        queue = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        env = {alerts.TOPIC_VARIABLE: topic, "HPL_REGION": REGION}
        sent = alerts.raise_alert(
            alerts.FAILED, run_dir=tmp_path / "run-a", step="train", job="12", detail="exited 1", env=env
        )
        (message,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(message["Body"])
    assert body["TopicArn"] == topic and body["Subject"] == "run run-a: failed (train)"
    assert AlertLine.parse_all(body["Message"]) == [sent]
    assert AlertLine.parse_all((tmp_path / "run-a" / "logs" / ALERTS_FILE).read_text()) == [sent]


def test_a_refused_publish_keeps_the_line_and_warns(tmp_path, capsys):
    with mock_aws():  # no such topic: SNS answers NotFound
        topic = f"arn:aws:sns:{REGION}:123456789012:gone"
        alerts.raise_alert(alerts.STALLED, run_dir=tmp_path, step="train", job="3", env={alerts.TOPIC_VARIABLE: topic})
    assert f"warning: alert not published to {topic}" in capsys.readouterr().err
    assert [a.state for a in AlertLine.parse_all((tmp_path / "logs" / ALERTS_FILE).read_text())] == [alerts.STALLED]


def test_no_topic_no_publish(tmp_path):
    def refuse(*_):
        raise AssertionError("published without a topic")

    alerts.raise_alert(alerts.FINISHED, run_dir=tmp_path, step="generate", job="9", env={}, publish=refuse)
    assert (tmp_path / "logs" / ALERTS_FILE).is_file()


def test_step_end_tells_failed_nan_stop_and_finished_only(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / StepLog("train", "5").name).write_text(f"{progress(1)}\nerror: {NAN_STOP_OPENING}loss is nan at step 2\n")
    (logs / StepLog("merge", "6").name).write_text("error: out of disk\n")
    write_record(
        logs,
        tmp_path / "run.toml",
        [StepJob(step=s, job=j, log="", nodes=1, config="") for s, j in (("train", "5"), ("generate", "7"))],
    )
    end = alerts.step_end_state
    state, detail = end("FAILED", 2, run_dir=tmp_path, step="train", job="5")
    assert state == alerts.NAN_STOP and detail.startswith(NAN_STOP_OPENING)
    assert end("FAILED", 1, run_dir=tmp_path, step="merge", job="6") == (alerts.FAILED, "step merge (job 6) exited 1")
    assert end("COMPLETED", 0, run_dir=tmp_path, step="train", job="5") is None  # not the last job
    assert end("COMPLETED", 0, run_dir=tmp_path, step="generate", job="7")[0] == alerts.FINISHED
    assert end("CANCELLED", 143, run_dir=tmp_path, step="generate", job="7") is None


def test_stall_watch_tells_once_per_stall(tmp_path):
    log = tmp_path / "train-1.log"
    log.write_text(progress(1) + "\n")
    now = [0.0]
    # The step's log over time: quiet for 3 polls (stall at 20 s), then a progress line, then quiet again.
    script = {3: progress(2), 8: None}
    polls = [0]
    told: list[float] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        polls[0] += 1
        if script.get(polls[0]):
            log.write_text(log.read_text() + script[polls[0]] + "\n")

    stalls = alerts.watch_stall(
        log=log,
        stall_s=20,
        alive=lambda: polls[0] < 10,
        on_stall=told.append,
        poll_s=10,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert stalls == 2 and told == [20.0, 20.0]  # at poll 2 (20 s quiet), then at poll 5 (20 s after poll 3)


def test_watch_off_returns_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HPL_RUN_DIR", str(tmp_path))
    assert alerts.main(["watch", "--pid", "1", "--stall-minutes", "0"]) == 0
    assert not (tmp_path / "logs" / ALERTS_FILE).exists()
