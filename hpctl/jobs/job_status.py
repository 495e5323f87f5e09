"""`hpctl job status|logs|stop`: read a training job, its cost so far and its CloudWatch streams.

Cost comes from the AWS Price List API (service AmazonSageMaker, the on-demand `<region>-Train:<type>`
usage type): the published per-hour price, never a number kept here. SageMaker bills
BillableTimeInSeconds per instance at that rate (managed spot shortens the billable time rather than
changing the rate); while a job runs, the time since it started stands in. When the price list has no
entry for the type, or cannot be reached, status says so and shows no cost.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import boto3
from botocore.exceptions import ClientError

from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.pricing import PRICE_SOURCE, HourlyPrice
from hpctl.jobs.job_spec import JOB_NAME_PREFIX

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
RUNNING = ("InProgress", "Stopping")


def newest_job(sagemaker) -> str:
    with aws_errors("list training jobs"):
        jobs = sagemaker.list_training_jobs(
            NameContains=JOB_NAME_PREFIX, SortBy="CreationTime", SortOrder="Descending", MaxResults=10
        )["TrainingJobSummaries"]
    jobs = [job for job in jobs if job["TrainingJobName"].startswith(JOB_NAME_PREFIX)]
    if not jobs:
        raise HpctlError("no training jobs of this project in this region: start one with `hpctl job submit`")
    return jobs[0]["TrainingJobName"]


def describe_job(sagemaker, name: str) -> dict:
    with aws_errors(f"describe training job {name}"):
        try:
            return sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ValidationException":
                raise
            raise HpctlError(
                f"no training job {name} in {sagemaker.meta.region_name}: `hpctl job status` shows the newest"
            ) from None


NOTES = {
    "billed": "",
    "running": " so far (running; SageMaker reports the billable figure at the end)",
    "elapsed": " (start to end: SageMaker reported no billable figure)",
}


def billed_seconds(job: dict, now: datetime | None = None) -> tuple[int, str]:
    """Billable seconds per instance, and where the figure comes from (a key of NOTES)."""
    if "BillableTimeInSeconds" in job:
        return int(job["BillableTimeInSeconds"]), "billed"
    start = job.get("TrainingStartTime")
    if start is None:
        return 0, "billed"  # not started: nothing billed yet
    end = job.get("TrainingEndTime")
    source = "elapsed" if end else "running"
    end = end or now or datetime.now(timezone.utc)
    return max(0, int((end - start).total_seconds())), source


def render_status(job: dict, price: HourlyPrice | None, *, now: datetime | None = None) -> str:
    resources = job.get("ResourceConfig", {})
    count, instance_type = resources.get("InstanceCount", 1), resources.get("InstanceType", "?")
    seconds, source = billed_seconds(job, now)
    spot = " (managed spot)" if job.get("EnableManagedSpotTraining") else ""
    lines = [
        f"job        {job['TrainingJobName']}",
        f"status     {job['TrainingJobStatus']} ({job.get('SecondaryStatus', '?')})",
        f"instances  {count} x {instance_type}{spot}",
    ]
    if job.get("FailureReason"):
        lines.append(f"failure    {job['FailureReason']}")
    if job.get("TrainingTimeInSeconds") is not None:
        lines.append(f"trained    {job['TrainingTimeInSeconds']} s")
    lines.append(f"billable   {seconds} s per instance{NOTES[source]}")
    trained = job.get("TrainingTimeInSeconds")
    if job.get("EnableManagedSpotTraining") and source == "billed" and trained:
        # DescribeTrainingJob's documented managed-spot saving: 1 - billable / training time.
        lines.append(f"spot       {100 * (1 - seconds / trained):.0f} % fewer billed seconds than trained")
    if price is None:
        lines.append(
            f"cost       not shown: no published on-demand training price for {instance_type} ({PRICE_SOURCE})"
        )
    else:
        cost = price.usd * seconds * count / 3600
        lines.append(
            f"cost       ${cost:,.2f}{' so far' if source == 'running' else ''} = {count} x {seconds} s x "
            f"${price.usd:,.4f}/h ({price.usage_type}; {PRICE_SOURCE})"
        )
    if job.get("CheckpointConfig"):
        lines.append(f"run folder {job['CheckpointConfig']['S3Uri']}")
    artifacts = job.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if artifacts:
        lines.append(f"model      {artifacts}")
    return "\n".join(lines)


def log_streams(session: boto3.Session, name: str) -> list[str]:
    logs = session.client("logs")
    with aws_errors(f"list log streams of {name}"):
        try:
            pages = logs.get_paginator("describe_log_streams").paginate(
                logGroupName=LOG_GROUP, logStreamNamePrefix=f"{name}/"
            )
            return sorted(stream["logStreamName"] for page in pages for stream in page["logStreams"])
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            return []


def stream_lines(session: boto3.Session, stream: str, token: str | None = None) -> tuple[list[str], str | None]:
    """The stream's lines after ``token`` (from its start without one), and the token to read on from."""
    logs = session.client("logs")
    lines = []
    with aws_errors(f"read log stream {stream}"):
        while True:
            kwargs = {"nextToken": token} if token else {}
            page = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=True, **kwargs)
            lines += [event["message"] for event in page["events"]]
            if not page["events"] or page.get("nextForwardToken") in (None, token):
                return lines, page.get("nextForwardToken") or token
            token = page["nextForwardToken"]


def show_logs(session: boto3.Session, name: str, *, tail: int) -> None:
    streams = log_streams(session, name)
    if not streams:
        job = describe_job(session.client("sagemaker"), name)
        print(
            f"no log streams yet for {name} ({job['TrainingJobStatus']}, {job.get('SecondaryStatus', '?')}): "
            "SageMaker starts them when the instances start"
        )
        return
    for stream in streams:
        lines, _ = stream_lines(session, stream)
        print(f"==> {LOG_GROUP} {stream} ({len(lines)} lines) <==")
        for line in lines[-tail:] if tail else lines:
            print(line)


def follow_logs(session: boto3.Session, name: str, *, interval_s: float = 10.0) -> str:
    """Print every host's new lines, prefixed with the host, until the job ends; its final status."""
    sagemaker = session.client("sagemaker")
    tokens: dict[str, str | None] = {}
    while True:
        status = describe_job(sagemaker, name)["TrainingJobStatus"]  # before reading: no line is missed
        for stream in log_streams(session, name):
            lines, tokens[stream] = stream_lines(session, stream, tokens.get(stream))
            host = stream.split("/", 1)[-1].rsplit("-", 1)[0]
            for line in lines:
                print(f"[{host}] {line}", flush=True)
        if status not in RUNNING:
            print(f"== {name} is {status}", flush=True)
            return status
        time.sleep(interval_s)


def stop_job(sagemaker, name: str) -> str:
    job = describe_job(sagemaker, name)
    status = job["TrainingJobStatus"]
    if status not in RUNNING:
        raise HpctlError(f"training job {name} is {status}: there is nothing to stop")
    with aws_errors(f"stop training job {name}"):
        sagemaker.stop_training_job(TrainingJobName=name)
    return f"stopping {name} (was {status}); SageMaker uploads what the run folder holds, then marks it Stopped"
