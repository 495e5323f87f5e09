"""`hpctl status`'s metrics line, `hpctl metrics RUN`, `hpctl dashboard` and `hpctl observability enable`.

moto plays CloudFormation, SageMaker's cluster and AMP's DescribeWorkspace; botocore's Stubber plays
SageMaker's ClusterExtension calls (moto has none). A local HTTP server stands in for the workspace's
PromQL endpoint: it answers only requests whose SigV4 signature (service aps) verifies against the
request it received, and evaluates the few query shapes hpctl sends over a table of samples.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.stub import Stubber

from cluster_contract import MANAGED_EXTENSION, ObservabilityOutput, StackOutput
from hpctl.observe import observability
from tests.hpctl.conftest import FIXTURE_SESSION, REGION, STACK, outputs_template
from tests.local_http import serving

RUN = "llama-lora"


class Ago(float):
    """A timestamp this many seconds before the query is evaluated."""


AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[A-Z0-9]+)/(?P<day>\d{8})/(?P<region>[a-z0-9-]+)/(?P<service>[a-z]+)"
    r"/aws4_request, "
    r"SignedHeaders=(?P<headers>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})$"
)
# (series, labels, value): the smoke job's figures, then the long run's newer ones.
SAMPLES = [
    ("up", {"job": "node", "node": "compute-0"}, 1.0),
    ("up", {"job": "dcgm", "node": "compute-0"}, 0.0),
    ("hpl_train_step", {"run": RUN, "slurm_job_id": "11"}, 4.0),
    ("hpl_train_loss", {"run": RUN, "slurm_job_id": "11"}, 2.5),
    ("hpl_train_last_update_timestamp_seconds", {"run": RUN, "slurm_job_id": "11"}, Ago(900)),
    ("hpl_train_step", {"run": RUN, "slurm_job_id": "14"}, 120.0),
    ("hpl_train_max_steps", {"run": RUN, "slurm_job_id": "14"}, 1000.0),
    ("hpl_train_loss", {"run": RUN, "slurm_job_id": "14"}, 1.23456),
    ("hpl_train_learning_rate", {"run": RUN, "slurm_job_id": "14"}, 0.0002),
    ("hpl_train_tokens_per_second", {"run": RUN, "slurm_job_id": "14"}, 15155.4),
    ("hpl_train_mfu_ratio", {"run": RUN, "slurm_job_id": "14"}, float("nan")),
    ("hpl_train_eta_seconds", {"run": RUN, "slurm_job_id": "14"}, 3723.0),
    ("hpl_train_last_update_timestamp_seconds", {"run": RUN, "slurm_job_id": "14"}, Ago(12)),
]
VERSION = {"ExtensionVersion": "1.0"}
SELECTOR = re.compile(r"^last_over_time\((?P<name>\w+)\{(?P<labels>[^}]*)\}\[7d\]\)$")


def evaluate(expr: str) -> list[dict]:
    """The query shapes hpctl sends, over SAMPLES; anything else is a bad query (400)."""
    now = time.time()
    ups = [value for name, _, value in SAMPLES if name == "up"]
    if expr == "max(timestamp(up))":
        return [{"metric": {}, "value": [now, str(now - 7)]}]
    if expr == "count(up == 1)":
        return [{"metric": {}, "value": [now, str(sum(1 for value in ups if value == 1))]}]
    if expr == observability.FAILED_EXPORTERS:
        return [{"metric": labels, "value": [now, str(count)]} for labels, count in FakeWorkspace.failed_exporters]
    match = SELECTOR.match(expr)
    if not match:
        raise ValueError(expr)
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
    return [
        {"metric": labels, "value": [now, sample(now - value if isinstance(value, Ago) else value)]}
        for name, labels, value in SAMPLES
        if name == match["name"] and wanted.items() <= labels.items()
    ]


def sample(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(value)


def verified(handler: BaseHTTPRequestHandler) -> str:
    """'' when the request carries a well-formed SigV4 signature for aps that matches what was received."""
    header = handler.headers.get("Authorization", "")
    match = AUTHORIZATION.match(header)
    if not match:
        return f"malformed Authorization header: {header!r}"
    key, secret = FakeWorkspace.credentials
    if match["key"] != key:
        return f"signed with access key {match['key']}, not {key}"
    if (match["service"], match["region"]) != ("aps", REGION):
        return f"signed for {match['service']} in {match['region']}"
    stamp = handler.headers.get("X-Amz-Date", "")
    if not stamp.startswith(match["day"]):
        return f"X-Amz-Date {stamp!r} is not the credential's day"
    signed = match["headers"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return f"host and x-amz-date must be signed: {signed}"
    host = handler.headers["Host"]
    request = AWSRequest(
        method=handler.command, url=f"http://{host}{handler.path}", headers={h: handler.headers[h] for h in signed}
    )
    request.context["timestamp"] = stamp
    auth = SigV4Auth(Credentials(key, secret), "aps", REGION)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    return "" if expected == match["signature"] else "signature does not match the request received"


class FakeWorkspace(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []
    failed_exporters: ClassVar[list[tuple[dict, int]]] = []  # (exporter and reason labels, nodes)
    credentials: tuple[str, str] = ("", "")  # the caller's access key and secret, as AMP knows them

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        problem = verified(self)
        if problem:
            return self.answer(403, {"message": problem})
        if not url.path.endswith("/api/v1/query"):
            return self.answer(404, {"message": url.path})
        expr = urllib.parse.parse_qs(url.query)["query"][0]
        FakeWorkspace.requests.append(expr)
        try:
            result = evaluate(expr)
        except ValueError:
            return self.answer(400, {"status": "error", "errorType": "bad_data", "error": f"unexpected {expr}"})
        self.answer(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

    def answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint_server():
    with serving(FakeWorkspace) as url:
        yield url


def redeploy(outputs: dict[str, str]) -> None:
    """The stack again with these outputs added (the deploy of another observability mode)."""
    cloudformation = FIXTURE_SESSION.client("cloudformation")
    stack = cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]
    current = {item["OutputKey"]: item["OutputValue"] for item in stack["Outputs"]}
    cloudformation.delete_stack(StackName=STACK)
    cloudformation.create_stack(StackName=STACK, TemplateBody=outputs_template({**current, **outputs}))


@pytest.fixture
def prometheus_stack(deployed, endpoint_server):
    workspace = FIXTURE_SESSION.client("amp").create_workspace(alias="hpl-test")["workspaceId"]
    endpoint = f"{endpoint_server}/workspaces/{workspace}/"
    redeploy({ObservabilityOutput.MODE: "prometheus", ObservabilityOutput.METRICS_ENDPOINT: endpoint})
    FakeWorkspace.requests.clear()
    FakeWorkspace.failed_exporters.clear()
    FakeWorkspace.credentials = (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    return workspace, endpoint


@pytest.fixture
def extensions(monkeypatch):
    """SageMaker's ClusterExtension calls, stubbed; hpctl's client for them is this one."""
    client = FIXTURE_SESSION.client("sagemaker")
    stubber = Stubber(client)
    monkeypatch.setattr(observability, "sagemaker_client", lambda session: client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


def test_workspace_id_comes_from_the_endpoint():
    endpoint = "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-0123abcd-45ef/"
    assert observability.workspace_id(endpoint) == "ws-0123abcd-45ef"
    assert observability.workspace_id("https://example.com/prometheus/") == ""


def test_status_names_the_mode_the_workspace_and_fresh_samples(prometheus_stack, hpctl):
    workspace, _ = prometheus_stack
    code, out, err = hpctl("status")
    assert (code, err) == (0, "")
    (line,) = [line for line in out.splitlines() if line.startswith("Metrics")]
    assert line == f"Metrics      prometheus  workspace {workspace} ACTIVE; last sample 7 s ago, 1 targets up"
    code, out, _ = hpctl("status", "--json")
    found = json.loads(out)["observability"]
    assert (found["workspace_status"], found["targets_up"], found["last_sample_age_s"]) == ("ACTIVE", 1, 7)


def test_status_names_an_exporter_the_nodes_could_not_start(prometheus_stack, hpctl):
    reason = "python module prometheus_client missing for neuron-monitor-prometheus.py"
    FakeWorkspace.failed_exporters.append(({"exporter": "neuron", "reason": reason}, 3))
    _, out, _ = hpctl("status")
    (line,) = [line for line in out.splitlines() if line.startswith("Metrics")]
    assert line.endswith(f"1 targets up; neuron exporter not running on 3 nodes: {reason}")


def test_the_failed_exporter_series_is_the_one_the_lifecycle_writes(tmp_path):
    script = Path(__file__).resolve().parents[2] / "lifecycle" / "slurm_metrics.py"
    subprocess.run([sys.executable, str(script), "exporter-state", str(tmp_path), "neuron", "why"], check=True)
    (sample,) = [line for line in (tmp_path / "hpl_exporter_neuron.prom").read_text().splitlines() if line[0] != "#"]
    assert sample.startswith(f"{observability.EXPORTER_FAILED}{{")


def test_status_says_when_the_query_fails_and_goes_on(prometheus_stack, hpctl, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")  # a signature AMP cannot verify
    code, out, _ = hpctl("status")
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("Metrics")]
    assert "query failed: the metrics endpoint answered 403" in line and "signature does not match" in line


def test_status_of_a_stack_deployed_before_the_key(deployed, hpctl):
    _, out, _ = hpctl("status")
    assert "Metrics      not recorded by this stack (deployed before the observability key)" in out


def test_status_in_managed_mode_shows_the_extension(deployed, extensions, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed"})
    arn = f"{deployed.cluster_arn}/extension/obs"
    extensions.add_response(
        "list_cluster_extensions",
        {"Extensions": [{"ExtensionArn": arn, "ExtensionName": MANAGED_EXTENSION, **VERSION, "Status": "Degraded"}]},
        {"ClusterArn": deployed.cluster_arn},
    )
    _, out, _ = hpctl("status")
    assert f"Metrics      managed  {MANAGED_EXTENSION} extension Degraded" in out


def test_metrics_prints_the_newest_job_of_the_run(prometheus_stack, hpctl):
    code, out, err = hpctl("metrics", RUN)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"run {RUN}  (Slurm job 14, figures from 12 s ago)",
        "  step          120 / 1000",
        "  loss          1.2346",
        "  learning rate 0.0002",
        "  tokens/s      15,155",
        "  MFU           -",  # NaN: the engine could not tell (no peak FLOPs for the device)
        "  ETA           1:02:03",
    ]
    assert all('slurm_job_id="14"' in expr for expr in FakeWorkspace.requests[1:])


def test_metrics_of_an_unknown_run(prometheus_stack, hpctl):
    code, _, err = hpctl("metrics", "never-ran")
    assert code == 2
    assert err.startswith("error: no figures for run 'never-ran' in the last 7d at http://127.0.0.1:")


def test_metrics_without_a_workspace(deployed, hpctl):
    redeploy({ObservabilityOutput.MODE: "off"})
    code, _, err = hpctl("metrics", RUN)
    assert (code, err) == (
        2,
        f"error: stack {STACK} has no metrics workspace (observability = off): "
        "set observability = prometheus in cdk.json and `make deploy`\n",
    )


def test_metrics_without_credentials(prometheus_stack, hpctl, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    _, endpoint = prometheus_stack
    code, _, err = hpctl("metrics", RUN, "--endpoint", endpoint)
    assert code == 2 and err.startswith("error: no AWS credentials found")


def test_dashboard_names_the_file_the_data_source_and_identity_center(prometheus_stack, hpctl, project):
    _, endpoint = prometheus_stack
    code, out, _ = hpctl("dashboard")
    assert code == 0
    assert out.splitlines()[0] == f"Dashboard  {project / 'observability' / 'dashboards' / 'cluster-and-run.json'}"
    assert f"URL {endpoint}, SigV4 auth on (service aps, region {REGION})" in out
    assert "IAM Identity Center" in out


OFFERED = {"ExtensionVersions": [{"ExtensionVersion": "1.0"}, {"ExtensionVersion": "1.1"}]}
LIST_VERSIONS = {"ExtensionName": MANAGED_EXTENSION}


def installed(extensions, cluster_arn: str, version: str, status: str = "Active") -> str:
    arn = f"{cluster_arn}/extension/obs"
    extensions.add_response(
        "list_cluster_extensions",
        {"Extensions": [{"ExtensionArn": arn, "ExtensionName": MANAGED_EXTENSION, "ExtensionVersion": version,
                         "Status": status}]},
        {"ClusterArn": cluster_arn},
    )  # fmt: skip
    return arn


def test_enable_installs_the_pinned_version_once(deployed, extensions, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed"})
    arn = f"{deployed.cluster_arn}/extension/obs"
    cluster = {"ClusterArn": deployed.cluster_arn}
    extensions.add_response("list_cluster_extensions", {"Extensions": []}, cluster)
    extensions.add_response("list_cluster_extension_versions", OFFERED, LIST_VERSIONS)
    extensions.add_response(
        "create_cluster_extension",
        {"ExtensionArn": arn},
        {**cluster, "ExtensionName": MANAGED_EXTENSION, "ExtensionVersion": observability.EXTENSION_VERSION},
    )
    assert hpctl("observability", "enable")[1] == (
        f"{MANAGED_EXTENSION} {observability.EXTENSION_VERSION} is being installed ({arn}): "
        "`hpctl status` shows when it is Active\n"
    )
    installed(extensions, deployed.cluster_arn, "1.0", status="Creating")
    assert hpctl("observability", "enable")[1] == (
        f"{MANAGED_EXTENSION} 1.0 is already on the cluster (Creating): nothing to do "
        "(`hpctl observability update` moves its version)\n"
    )


def test_enable_refuses_a_version_sagemaker_does_not_offer(deployed, extensions, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed"})
    extensions.add_response("list_cluster_extensions", {"Extensions": []}, {"ClusterArn": deployed.cluster_arn})
    extensions.add_response("list_cluster_extension_versions", OFFERED, LIST_VERSIONS)
    code, _, err = hpctl("observability", "enable", "--version", "0.9")
    assert (code, err) == (
        2,
        f"error: {MANAGED_EXTENSION} version 0.9 is not offered (offered: 1.0, 1.1): "
        "pass --version with one of those\n",
    )


def test_update_lists_the_versions_first_then_moves_to_the_one_asked(deployed, extensions, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed"})
    installed(extensions, deployed.cluster_arn, "1.0")
    extensions.add_response("list_cluster_extension_versions", OFFERED, LIST_VERSIONS)
    code, out, _ = hpctl("observability", "update")
    assert code == 0
    assert out.splitlines()[1:] == ["  * 1.0", "    1.1", "pass --version VERSION to move the cluster to one of them"]

    arn = installed(extensions, deployed.cluster_arn, "1.0")
    extensions.add_response("list_cluster_extension_versions", OFFERED, LIST_VERSIONS)
    extensions.add_response(
        "update_cluster_extension",
        {"ExtensionArn": arn},
        {"ClusterArn": deployed.cluster_arn, "ExtensionArn": arn, "ExtensionVersion": "1.1"},
    )
    code, out, _ = hpctl("observability", "update", "--version", "1.1")
    assert code == 0 and out.splitlines()[-1].startswith(f"{MANAGED_EXTENSION} moves from 1.0 to 1.1")


def test_update_without_the_extension_says_how_to_install_it(deployed, extensions, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed"})
    extensions.add_response("list_cluster_extensions", {"Extensions": []}, {"ClusterArn": deployed.cluster_arn})
    code, _, err = hpctl("observability", "update", "--version", "1.1")
    assert code == 2 and "`hpctl observability enable` installs it" in err


def test_enable_refuses_a_stack_in_prometheus_mode(prometheus_stack, hpctl):
    code, _, err = hpctl("observability", "enable")
    assert code == 2
    assert err.startswith(f"error: stack {STACK} has observability = prometheus: AWS's extension is for")


def test_enable_waits_for_a_cluster_in_service(deployed, hpctl):
    redeploy({ObservabilityOutput.MODE: "managed", StackOutput.CLUSTER_ARN: deployed.cluster_arn})
    deployed.set_cluster(status="Creating")
    code, _, err = hpctl("observability", "enable")
    assert code == 2 and "is Creating: `hpctl wait`" in err
