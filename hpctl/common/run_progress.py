"""`hpctl status` and `hpctl job status`: where a pipeline run stands, from its files in S3.

The outputs folder on FSx is exported to s3://<bucket>/outputs/ (the same copy `hpctl logs steps`
reads, minutes behind the cluster), so the run's submission record (logs/pipeline.json), its step
markers (logs/state/, smoke/logs/state/), the running step's log and the smoke stage's estimate
(logs/estimate.json) can be read without a session on the cluster. A training job's run folder is
its checkpoint folder, which SageMaker syncs to the same place; it writes no markers, so a step's
state comes from its log (llm_pipeline.sagemaker_job ends each with the step's verdict line). The
running step's progress is the last metric line its trainer printed: ``step 120/1000 | loss 1.2 |
... | 15155 tokens/s | ... | eta 0:12:00`` (training/callbacks.py) or torchtitan's ``step: 120
loss: 7.1 ... tps: 6,475``; a loss of nan shows as NaN. Every line and file read here has its format
in llm_pipeline/run_files.py. The estimate's cost is its node-hours times the on-demand price of the
instance type (AWS Price List API: HyperPod `<region>-Cluster:<type>`, training jobs
`<region>-Train:<type>`); without one it says "price unknown".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath

from botocore.exceptions import ClientError

from cluster_contract import OUTPUTS_FOLDER, s3_prefix
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.pricing import PRICE_SOURCE, HourlyPrice, hourly_price
from llm_pipeline.run_files import (
    ALERTS_FILE,
    BENCHMARK_DIR,
    BENCHMARK_JSON,
    ESTIMATE_FILE,
    PIPELINE_FILE,
    STATE_DIR,
    AlertLine,
    Estimate,
    PipelineRecord,
    ProgressLine,
    StepMarker,
    StepVerdict,
    TitanMetricLine,
    describe_number,
)

OUTPUTS_PREFIX = s3_prefix(OUTPUTS_FOLDER)
CLUSTER_USAGE = "Cluster"  # the Price List API's HyperPod usage types: <region>-Cluster:ml.<type>
TAIL_BYTES = 64 * 1024  # of the running step's log: enough for its last metric lines
VERDICT_BYTES = 512  # of a training job's step log: its last line, `== <step>: COMPLETED (exit 0) after N s`


@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None
    loss: float
    tokens_per_second: float
    eta: str | None

    def describe(self) -> str:
        total = f"/{self.total}" if self.total else ""
        eta = f", eta {self.eta}" if self.eta else ""
        loss = describe_number(self.loss)
        return f"step {self.step}{total}, loss {loss}, {self.tokens_per_second:,.0f} tokens/s{eta}"


def last_progress(log_text: str) -> Progress | None:
    """The last metric line of a training log, or None when it has printed none yet. A loss of nan or
    inf is the run's news, so it is shown as it is."""
    for line in reversed(log_text.splitlines()):
        if found := ProgressLine.parse(line):
            return Progress(found.step, found.total, found.loss, found.tokens_per_second, found.eta)
        if titan := TitanMetricLine.parse(line):
            return Progress(titan.step, None, titan.loss, float(titan.tps), None)
    return None


def state_from_log(tail: str | None, step: str) -> str:
    """A training job's step: COMPLETED or FAILED once its log ends with the verdict, RUNNING before, "-"
    when it has no log yet."""
    if tail is None:
        return "-"
    found = StepVerdict.last(tail, step)
    return found.state if found else "RUNNING"


def _key(run: str, path: str) -> str:
    """The S3 key of a file of the run folder, from its path on the cluster (<outputs>/<run>/...)."""
    parts = PurePosixPath(path).parts
    inside = parts[len(parts) - 1 - parts[::-1].index(run) + 1 :] if run in parts else parts[-2:]
    return f"{OUTPUTS_PREFIX}{run}/{'/'.join(inside)}"


def _read(s3, bucket: str, key: str, *, tail: int | None = None) -> str | None:
    extra = {"Range": f"bytes=-{tail}"} if tail else {}
    try:
        return s3.get_object(Bucket=bucket, Key=key, **extra)["Body"].read().decode("utf-8", errors="replace")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "InvalidRange"):
            return None
        raise


def run_alerts(s3, bucket: str, run: str) -> list[AlertLine]:
    """The alerts the run side raised (<run>/logs/alerts.jsonl, jobs/alerts.py), oldest first; none yet: []."""
    with aws_errors(f"read the alerts of run {run}"):
        text = _read(s3, bucket, f"{OUTPUTS_PREFIX}{run}/logs/{ALERTS_FILE}")
    return AlertLine.parse_all(text or "")


def list_runs(s3, bucket: str) -> list[str]:
    runs: list[str] = []
    with aws_errors(f"list s3://{bucket}/{OUTPUTS_PREFIX}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=OUTPUTS_PREFIX, Delimiter="/"):
            runs += [item["Prefix"][len(OUTPUTS_PREFIX) :].rstrip("/") for item in page.get("CommonPrefixes", [])]
    return sorted(runs)


def check_run(run: str, runs: list[str], bucket: str) -> None:
    """Refuse a run with no folder under outputs/ in the bucket, naming those there (``runs``: list_runs)."""
    if run not in runs:
        raise HpctlError(f"no run {run!r} in s3://{bucket}/{OUTPUTS_PREFIX} (runs: {', '.join(runs) or 'none'})")


def newest_run(s3, bucket: str) -> str | None:
    """The run whose submission record was written last."""
    newest = None
    for run in list_runs(s3, bucket):
        try:
            head = s3.head_object(Bucket=bucket, Key=f"{OUTPUTS_PREFIX}{run}/logs/{PIPELINE_FILE}")
        except ClientError:
            continue
        if newest is None or head["LastModified"] > newest[0]:
            newest = (head["LastModified"], run)
    return newest[1] if newest else None


def run_progress(s3, bucket: str, run: str) -> dict:
    """Each step's state (its marker), the running step's progress and the estimate, as one document."""
    record = _read(s3, bucket, f"{OUTPUTS_PREFIX}{run}/logs/{PIPELINE_FILE}")
    jobs = PipelineRecord.from_json(record).steps if record else ()
    steps, current = [], None
    for job in jobs:
        marker_path = str(PurePosixPath(job.log).parent / STATE_DIR / f"{job.step}.json")
        marker_text = _read(s3, bucket, _key(run, marker_path))
        marker = StepMarker.from_json(marker_text) if marker_text else None
        state = marker.state if marker and marker.job == job.job else None
        if state is None:  # a training job writes no markers: its step logs end with the verdict line
            state = state_from_log(_read(s3, bucket, _key(run, job.log), tail=VERDICT_BYTES), job.step)
        steps.append({"step": job.step, "job": job.job, "state": state})
        if state == "RUNNING":
            current = job
    progress = None
    if current is not None:
        progress = last_progress(_read(s3, bucket, _key(run, current.log), tail=TAIL_BYTES) or "")
    estimate = _read(s3, bucket, f"{OUTPUTS_PREFIX}{run}/logs/{ESTIMATE_FILE}")
    benchmark = _read(s3, bucket, f"{OUTPUTS_PREFIX}{run}/{BENCHMARK_DIR}/{BENCHMARK_JSON}")
    return {
        "run": run,
        "steps": steps,
        "running": current.step if current else None,
        "progress": progress,
        "estimate": Estimate.from_json(estimate) if estimate else None,
        "benchmark": json.loads(benchmark)["tasks"] if benchmark else None,  # the benchmark step's rows, once written
    }


def partition_instance_types(context: dict) -> dict[str, str]:
    """{partition: instance type} from cdk.json's compute_groups."""
    groups = context.get("compute_groups") or []
    return {
        group["partition"]: group["instance_type"]
        for group in groups
        if isinstance(group, dict) and group.get("partition") and group.get("instance_type")
    }


def cluster_price(pricing, instance_type: str | None, region: str) -> HourlyPrice | None:
    return hourly_price(pricing, instance_type, region, usage=CLUSTER_USAGE) if instance_type else None


def _price_unknown(instance_type: str | None) -> str:
    what = f"for {instance_type}" if instance_type else "(the run's partition is not in cdk.json compute_groups)"
    return f"price unknown {what}: no on-demand price found ({PRICE_SOURCE})"


def describe_cost(node_hours: float, instance_type: str | None, price: HourlyPrice | None) -> str:
    if price is None:
        return _price_unknown(instance_type)
    return (
        f"${node_hours * price.usd:,.2f} = {node_hours:.3f} node-hours x ${price.usd:,.4f}/h "
        f"({price.usage_type}; {PRICE_SOURCE})"
    )


def describe_hourly(nodes: int, instance_type: str | None, price: HourlyPrice | None) -> str:
    """What a job holding ``nodes`` of ``instance_type`` costs per hour (a serve job), at the estimate's prices."""
    if price is None:
        return _price_unknown(instance_type)
    return f"${nodes * price.usd:,.2f}/h = {nodes} x {instance_type} at ${price.usd:,.4f}/h ({price.usage_type})"


def render(progress: dict, cost: str | None) -> list[str]:
    lines = [f"Run          {progress['run']}"]
    for step in progress["steps"]:
        lines.append(f"  {step['step']:<22} {step['job']:>8}  {step['state']}")
    if progress["running"]:
        found = progress["progress"]
        detail = found.describe() if found else "no metric line yet"
        lines.append(f"  running: {progress['running']}: {detail}")
    estimate = progress["estimate"]
    if estimate:
        total = timedelta(seconds=round(estimate.total_seconds))
        lines.append(f"  estimate (smoke run): {total} for the long steps, {estimate.node_hours:.3f} node-hours")
        if cost:
            lines.append(f"  cost: {cost}")
        lines.append(f"  note: {estimate.note}")
    if progress.get("benchmark"):
        lines.append(f"  benchmark (<run>/{BENCHMARK_DIR}/): task, metric, base ± stderr, tuned ± stderr, delta")
        lines += [
            f"    {row['task']:<20} {row['metric']:<28} {_scored(row['base'], row['base_stderr'])}  "
            f"{_scored(row['tuned'], row['tuned_stderr'])}  {row['delta']:+.4f}"
            for row in progress["benchmark"]
        ]
    return lines


def _scored(score: float, stderr: float | None) -> str:
    return f"{score:.4f} ± {stderr:.4f}" if stderr is not None else f"{score:.4f} ± -     "
