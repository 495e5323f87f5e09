"""Observability from the laptop: the mode's health for `hpctl status`, a run's latest figures (`hpctl
metrics RUN`) from the PromQL endpoint, where the dashboard is (`hpctl dashboard`), and the managed
mode's one post-deploy step (`hpctl observability enable`).

The stack's outputs say the mode (`Observability`) and, in prometheus mode, the Amazon Managed
Prometheus workspace's endpoint (`MetricsEndpoint`). AMP's query API is plain Prometheus HTTP behind
SigV4 (service ``aps``): botocore signs the request with the caller's credentials and urllib sends it,
so hpctl needs no extra package. The managed mode's extension (`sagemaker-observability`) is read and
installed through SageMaker's ClusterExtension calls.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from cluster_contract import (
    MANAGED_EXTENSION,
    MANAGED_MODE,
    OFF_MODE,
    PROMETHEUS_MODE,
    QUERY_PATH,
    ObservabilityOutput,
    StackOutput,
)
from hpctl.common.errors import HpctlError, aws_errors, no_credentials_message
from hpctl.common.stack import StackInfo
from llm_pipeline.run_files import RUN_SERIES, RUN_SERIES_BY_KEY

SIGNING_SERVICE = "aps"
QUERY_TIMEOUT_S = 20
RUN_LOOKBACK = "7d"  # `hpctl metrics` finds a run's last figures this far back
DASHBOARD = Path("observability") / "dashboards" / "cluster-and-run.json"
EXPORTER_FAILED = "hpl_exporter_failed"  # an exporter a node could not start (lifecycle/slurm_metrics.py writes it)
FAILED_EXPORTERS = f"count by (exporter, reason) ({EXPORTER_FAILED} == 1)"
WORKSPACE_IN_ENDPOINT = re.compile(r"/workspaces/(?P<id>ws-[^/]+)/?$")


def workspace_id(endpoint: str) -> str:
    """ws-... from a workspace's prometheusEndpoint (https://aps-workspaces.<region>.amazonaws.com/workspaces/ws-.../)."""
    match = WORKSPACE_IN_ENDPOINT.search(urllib.parse.urlsplit(endpoint).path)
    return match["id"] if match else ""


@dataclass(frozen=True)
class PromQL:
    """Instant queries against a Prometheus HTTP API; signed with SigV4 when credentials are at hand."""

    endpoint: str  # ends in a slash, as AMP's prometheusEndpoint does
    session: boto3.Session | None  # None: unsigned
    signed: bool = True

    def query(self, expr: str) -> list[dict]:
        url = f"{self.endpoint.rstrip('/')}/{QUERY_PATH}?{urllib.parse.urlencode({'query': expr})}"
        headers = self._signature(url) if self.signed else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=QUERY_TIMEOUT_S) as got:
                body = json.load(got)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            raise HpctlError(f"the metrics endpoint answered {error.code} to {expr!r}: {detail}") from error
        except (OSError, ValueError) as error:
            raise HpctlError(f"cannot query the metrics endpoint {self.endpoint}: {error}") from error
        if body.get("status") != "success":
            raise HpctlError(f"query {expr!r} failed: {body.get('errorType', '')} {body.get('error', body)}")
        return body["data"]["result"]

    def _signature(self, url: str) -> dict[str, str]:
        with aws_errors("read AWS credentials"):
            credentials = self.session.get_credentials()
        if credentials is None:
            raise HpctlError(no_credentials_message())
        request = AWSRequest(method="GET", url=url)
        SigV4Auth(credentials.get_frozen_credentials(), SIGNING_SERVICE, self.session.region_name).add_auth(request)
        return dict(request.headers.items())


def mode_of(stack: StackInfo) -> str:
    """The stack's observability mode; '' for a stack deployed before the key existed."""
    return stack.output(ObservabilityOutput.MODE)


def sagemaker_client(session: boto3.Session):
    return session.client("sagemaker")


def extension(client, cluster_arn: str) -> dict | None:
    """The cluster's sagemaker-observability extension as ListClusterExtensions reports it, or None."""
    with aws_errors(f"list the extensions of {cluster_arn}"):
        for page in client.get_paginator("list_cluster_extensions").paginate(ClusterArn=cluster_arn):
            for found in page.get("Extensions", []):
                if found.get("ExtensionName") == MANAGED_EXTENSION:
                    return found
    return None


# The extension version hpctl installs: the one its ClusterExtension calls were written and tested against
# (tests/hpctl/test_hpctl_observability.py); `hpctl observability update --version V` moves a cluster on.
EXTENSION_VERSION = "1.0"  # VERIFY against ListClusterExtensionVersions on a real cluster


def offered_versions(client) -> list[str]:
    """The versions of sagemaker-observability SageMaker offers (ListClusterExtensionVersions), as it lists them."""
    with aws_errors(f"list the versions of {MANAGED_EXTENSION}"):
        return [
            found["ExtensionVersion"]
            for page in client.get_paginator("list_cluster_extension_versions").paginate(
                ExtensionName=MANAGED_EXTENSION
            )
            for found in page.get("ExtensionVersions", [])
        ]


def require_offered(version: str, offered: list[str]) -> None:
    if version not in offered:
        raise HpctlError(
            f"{MANAGED_EXTENSION} version {version} is not offered (offered: {', '.join(offered) or 'none'}): "
            "pass --version with one of those"
        )


def enable_extension(client, cluster_arn: str, version: str = EXTENSION_VERSION) -> str:
    """Install sagemaker-observability at ``version`` on the cluster unless it is there already; says which."""
    found = extension(client, cluster_arn)
    if found:
        return (
            f"{MANAGED_EXTENSION} {found.get('ExtensionVersion', '?')} is already on the cluster "
            f"({found.get('Status', 'unknown')}): nothing to do (`hpctl observability update` moves its version)"
        )
    require_offered(version, offered_versions(client))
    with aws_errors(f"install {MANAGED_EXTENSION} on {cluster_arn}"):
        arn = client.create_cluster_extension(
            ClusterArn=cluster_arn, ExtensionName=MANAGED_EXTENSION, ExtensionVersion=version
        )["ExtensionArn"]
    return f"{MANAGED_EXTENSION} {version} is being installed ({arn}): `hpctl status` shows when it is Active"


def update_extension(client, cluster_arn: str, version: str | None) -> str:
    """The offered versions, the installed one marked; with ``version``, move the extension to it."""
    found = extension(client, cluster_arn)
    if not found:
        raise HpctlError(f"{MANAGED_EXTENSION} is not on the cluster: `hpctl observability enable` installs it")
    installed = found.get("ExtensionVersion", "")
    offered = offered_versions(client)
    lines = [f"{MANAGED_EXTENSION} versions offered (* installed, tested with hpctl: {EXTENSION_VERSION}):"]
    lines += [f"  {'*' if name == installed else ' '} {name}" for name in offered]
    if version is None:
        return "\n".join([*lines, "pass --version VERSION to move the cluster to one of them"])
    require_offered(version, offered)
    if version == installed:
        return "\n".join([*lines, f"{MANAGED_EXTENSION} is at {version} already: nothing to do"])
    with aws_errors(f"update {MANAGED_EXTENSION} on {cluster_arn}"):
        client.update_cluster_extension(
            ClusterArn=cluster_arn, ExtensionArn=found["ExtensionArn"], ExtensionVersion=version
        )
    return "\n".join([*lines, f"{MANAGED_EXTENSION} moves from {installed} to {version}: `hpctl status` shows when"])


def prometheus_health(session: boto3.Session, endpoint: str, *, now: float) -> dict:
    """The workspace's status (DescribeWorkspace) and how fresh its newest `up` sample is."""
    health = {"mode": PROMETHEUS_MODE, "endpoint": endpoint, "workspace": workspace_id(endpoint)}
    with aws_errors(f"describe the metrics workspace {health['workspace']}"):
        found = session.client("amp").describe_workspace(workspaceId=health["workspace"])["workspace"]
    health["workspace_status"] = found["status"]["statusCode"]
    try:
        newest = PromQL(endpoint, session).query("max(timestamp(up))")  # within Prometheus' 5-minute lookback
        targets = PromQL(endpoint, session).query("count(up == 1)")
        failed = PromQL(endpoint, session).query(FAILED_EXPORTERS)
    except HpctlError as error:  # status reports; it does not stop on a query that failed
        health["samples"] = f"query failed: {error}"
        return health
    if newest:
        health["last_sample_age_s"] = round(max(0.0, now - float(newest[0]["value"][1])))
        health["targets_up"] = int(float(targets[0]["value"][1])) if targets else 0
    health["exporters_failed"] = [
        {**found["metric"], "nodes": int(float(found["value"][1]))}
        for found in sorted(failed, key=lambda found: found["metric"].get("exporter", ""))
    ]
    return health


def health(session: boto3.Session, stack: StackInfo, *, now: float | None = None) -> dict:
    """What `hpctl status` shows about observability, by mode."""
    mode = mode_of(stack)
    if mode == PROMETHEUS_MODE and stack.output(ObservabilityOutput.METRICS_ENDPOINT):
        return prometheus_health(
            session, stack.output(ObservabilityOutput.METRICS_ENDPOINT), now=time.time() if now is None else now
        )
    if mode == MANAGED_MODE:
        found = extension(sagemaker_client(session), stack.output(StackOutput.CLUSTER_ARN))
        return {"mode": mode, "extension": found.get("Status", "unknown") if found else "not installed"}
    return {"mode": mode or "not recorded"}


def render_health(found: dict) -> str:
    mode = found["mode"]
    if mode == PROMETHEUS_MODE:
        if "samples" in found:
            samples = found["samples"]
        elif "last_sample_age_s" in found:
            samples = f"last sample {found['last_sample_age_s']} s ago, {found['targets_up']} targets up"
        else:
            samples = "no samples in the last 5 minutes (nodes not up yet, or their collector cannot write)"
        for failed in found.get("exporters_failed", []):
            exporter, reason = failed.get("exporter"), failed.get("reason")
            samples += f"; {exporter} exporter not running on {failed['nodes']} nodes: {reason}"
        return f"{mode}  workspace {found['workspace']} {found['workspace_status']}; {samples}"
    if mode == MANAGED_MODE:
        hint = "  (`hpctl observability enable` installs it)" if found["extension"] == "not installed" else ""
        return f"{mode}  {MANAGED_EXTENSION} extension {found['extension']}{hint}"
    if mode == OFF_MODE:
        return "off"
    return "not recorded by this stack (deployed before the observability key): redeploy to set it"


def endpoint_for(stack: StackInfo) -> str:
    """The stack's PromQL endpoint, or an error saying why there is none."""
    mode = mode_of(stack)
    endpoint = stack.output(ObservabilityOutput.METRICS_ENDPOINT)
    if mode == PROMETHEUS_MODE and endpoint:
        return endpoint
    if mode == MANAGED_MODE:
        raise HpctlError(
            "observability = managed: the run's own figures are published only in prometheus mode; "
            "query the workspace of AWS's extension with --endpoint"
        )
    raise HpctlError(
        f"stack {stack.name} has no metrics workspace (observability = {mode or 'not set'}): "
        "set observability = prometheus in cdk.json and `make deploy`"
    )


def run_figures(promql: PromQL, run: str) -> dict:
    """The run's newest figures: the Slurm job that wrote last, its value of every series."""
    selector = f'{{run="{run}"}}'
    written = RUN_SERIES_BY_KEY["timestamp"].name
    newest = promql.query(f"last_over_time({written}{selector}[{RUN_LOOKBACK}])")
    if not newest:
        raise HpctlError(
            f"no figures for run {run!r} in the last {RUN_LOOKBACK} at {promql.endpoint}: has it logged a step "
            "(`hpctl logs steps RUN`), on a stack with observability = prometheus?"
        )
    latest = max(newest, key=lambda series: float(series["value"][1]))
    job = latest["metric"].get("slurm_job_id", "")
    labels = f'{{run="{run}",slurm_job_id="{job}"}}'
    figures: dict = {"run": run, "slurm_job_id": job, "queried_at": float(latest["value"][0])}
    for series in RUN_SERIES:  # what `hpctl metrics` prints, in order
        found = promql.query(f"last_over_time({series.name}{labels}[{RUN_LOOKBACK}])")
        if found:
            figures[series.key] = float(found[0]["value"][1])
    return figures


def _number(value: float | None, text: str) -> str:
    return "-" if value is None or math.isnan(value) else text


def render_figures(figures: dict) -> str:
    get = figures.get
    step = get("step")
    steps = f"{int(step)}" if step is not None else "-"
    if get("max_steps") is not None:
        steps += f" / {int(figures['max_steps'])}"
    age = figures["queried_at"] - get("timestamp", figures["queried_at"])
    eta = get("eta_seconds")
    rows = [
        ("step", steps),
        ("loss", _number(get("loss"), f"{get('loss', 0):.4f}")),
        ("learning rate", _number(get("learning_rate"), f"{get('learning_rate', 0):.3g}")),
        ("tokens/s", _number(get("tokens_per_second"), f"{get('tokens_per_second', 0):,.0f}")),
        ("MFU", _number(get("mfu"), f"{100 * get('mfu', 0):.1f}%")),
        ("ETA", _number(eta, f"{int(eta or 0) // 3600}:{int(eta or 0) % 3600 // 60:02d}:{int(eta or 0) % 60:02d}")),
    ]
    header = f"run {figures['run']}  (Slurm job {figures['slurm_job_id']}, figures from {round(age)} s ago)"
    return "\n".join([header, *(f"  {name:<14}{value}" for name, value in rows)])


def dashboard_text(*, root: Path, mode: str, endpoint: str, region: str) -> str:
    """Where the dashboard is and how to open it: Grafana is not part of the stack."""
    path = root / DASHBOARD
    lines = [
        f"Dashboard  {path}",
        "Import it into any Grafana (Dashboards > New > Import > Upload JSON file); pick a Prometheus data "
        "source when asked, then the run and job at the top.",
    ]
    if mode == PROMETHEUS_MODE and endpoint:
        lines += [
            f"Data source: Prometheus, URL {endpoint}, SigV4 auth on (service aps, region {region}), with "
            "credentials allowed aps:QueryMetrics on that workspace.",
            "Amazon Managed Grafana has the AMP data source built in, but a workspace needs IAM Identity Center "
            "(or SAML) for its users; the stack creates none. A local Grafana works too.",
        ]
    elif mode == MANAGED_MODE:
        lines.append(
            "observability = managed: point the data source at the AMP workspace of AWS's extension; the run "
            "panels stay empty (the run's own figures are published only in prometheus mode)."
        )
    else:
        lines.append(f"observability = {mode or 'not set'}: no metrics are collected; set prometheus and redeploy.")
    return "\n".join(lines)
