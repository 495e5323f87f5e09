"""`hpctl status` shows the newest run: each step's state, the running step's progress from the metric
lines its trainer printed, and the smoke run's estimate with its cost at the HyperPod on-demand price."""

from __future__ import annotations

import json
import math

import boto3
from botocore.stub import Stubber
from metric_lines import estimate_json, trainer_lines
from price_list_stub import price_item as stub_price_item
from price_list_stub import stubbed_pricing as stub_price_list

from hpctl.common import run_progress
from hpctl.common.pricing import hourly_price
from hpctl.observe import commands
from llm_pipeline.run_files import BENCHMARK_DIR, BENCHMARK_JSON, STATE_DIR, StepMarker
from tools import torchtitan_standin

RUN_DIR = "/fsx/outputs/tiny-lora"
REGION = "us-west-2"  # the `deployed` fixture's
BUCKET = "sagemaker-hpl-test-bucket"  # the `deployed` fixture's bucket
FIXTURE_SESSION = boto3.Session(region_name=REGION)


def put(s3, key: str, body: str) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"outputs/tiny-lora/{key}", Body=body.encode())


def write_run(s3, train_log: str, *, estimate: str | None) -> None:
    steps = [
        ("data", "11", "logs"),
        ("smoke-train", "12", "smoke/logs"),
        ("estimate", "13", "logs"),
        ("train", "14", "logs"),
        ("consolidate", "15", "logs"),
    ]
    record = [{"step": s, "job": j, "log": f"{RUN_DIR}/{where}/{s}-{j}.log", "nodes": 1} for s, j, where in steps]
    put(s3, "logs/pipeline.json", json.dumps({"config": "run.toml", "steps": record}))
    for step, job, where in steps[:4]:
        state = "RUNNING" if step == "train" else "COMPLETED"
        put(s3, f"{where}/{STATE_DIR}/{step}.json", StepMarker(step, job, state).to_json())
    put(s3, "logs/train-14.log", train_log)
    if estimate:
        put(s3, "logs/estimate.json", estimate)


def price_item(usage_type: str, usd: str) -> str:
    return stub_price_item(usage_type, usd, REGION)


def stubbed_pricing(items: list[str], instance_type: str):
    return stub_price_list(items, usage_suffix=f"-Cluster:{instance_type}", region=REGION)


def test_the_hyperpod_price_is_the_exact_on_demand_cluster_usage_type():
    items = [
        price_item("USW2-ReservedCluster:ml.trn1.32xlarge", "9.0"),
        price_item("USW2-Cluster:ml.trn1.32xlarge", "4.5"),
    ]
    price = hourly_price(stubbed_pricing(items, "ml.trn1.32xlarge"), "ml.trn1.32xlarge", REGION, usage="Cluster")
    assert (price.usd, price.usage_type) == (4.5, "USW2-Cluster:ml.trn1.32xlarge")
    assert run_progress.describe_cost(2.0, "ml.trn1.32xlarge", price).startswith("$9.00 = 2.000 node-hours x $4.5000/h")


def test_offline_the_price_is_unknown():
    offline = FIXTURE_SESSION.client("pricing", region_name="us-east-1")
    stubber = Stubber(offline)
    stubber.add_client_error("get_products", "UnrecognizedClientException", "no credentials")
    stubber.activate()
    price = run_progress.cluster_price(offline, "ml.trn1.32xlarge", REGION)
    assert price is None
    assert run_progress.describe_cost(2.0, "ml.trn1.32xlarge", price).startswith("price unknown for ml.trn1.32xlarge")


def test_torchtitan_progress_is_read_from_its_metric_line():
    line = "[titan] 2026-01-01 10:00:00,000 - root - INFO - " + torchtitan_standin.metric_line(
        120, 7.25, 1.0, 60.0, 75.0, 6475, 374.7, 37.9
    )
    found = run_progress.last_progress(f"starting\n{line}\n")
    assert (found.step, found.total, found.loss, found.tokens_per_second) == (120, None, 7.25, 6475.0)


def test_status_shows_the_running_step_and_the_estimate_with_its_cost(
    deployed, hpctl, capsys, tmp_path, monkeypatch, project
):
    context = json.loads((project / "cdk.json").read_text())
    context["context"]["compute_groups"] = [
        {"name": "compute", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"}
    ]
    (project / "cdk.json").write_text(json.dumps(context))
    s3 = boto3.client("s3", region_name=REGION)
    estimate = estimate_json(seconds=5400.0, nodes=1, note="billed...", partition="trn1")
    write_run(s3, trainer_lines(capsys, tmp_path, step=3, total=10), estimate=estimate)
    items = [price_item("USW2-Cluster:ml.trn1.32xlarge", "4.0")]
    monkeypatch.setattr(commands, "pricing_client", lambda session: stubbed_pricing(items, "ml.trn1.32xlarge"))

    code, out, err = hpctl("status")
    assert (code, err) == (0, "")
    run = out.split("Run          tiny-lora\n")[1].splitlines()
    assert [line.split() for line in run[:5]] == [
        ["data", "11", "COMPLETED"],
        ["smoke-train", "12", "COMPLETED"],  # its marker lies in the smoke run's folder
        ["estimate", "13", "COMPLETED"],
        ["train", "14", "RUNNING"],
        ["consolidate", "15", "-"],
    ]
    assert run[5].startswith("  running: train: step 3/10, loss 1.0000, 250 tokens/s, eta 0:00:14")
    assert run[6] == "  estimate (smoke run): 1:30:00 for the long steps, 1.500 node-hours"
    assert run[7].startswith("  cost: $6.00 = 1.500 node-hours x $4.0000/h (USW2-Cluster:ml.trn1.32xlarge;")

    # A partition cdk.json does not name, or no price: the cost is unknown, the rest stands.
    put(s3, "logs/estimate.json", estimate_json(seconds=5400.0, nodes=1, note="billed...", partition="gone"))
    code, out, _ = hpctl("status")
    assert code == 0 and "cost: price unknown (the run's partition is not in cdk.json compute_groups)" in out


def test_status_shows_a_diverged_run_as_diverged(deployed, hpctl, capsys, tmp_path):
    """A loss of nan in the running step's last metric line shows as NaN, not as its last finite step."""
    log = trainer_lines(capsys, tmp_path, step=3, total=10, losses={3: math.nan})
    write_run(boto3.client("s3", region_name=REGION), log, estimate=None)

    code, out, err = hpctl("status")
    assert (code, err) == (0, "")
    assert "  running: train: step 3/10, loss NaN, 250 tokens/s" in out

    code, out, err = hpctl("status", "--json")
    assert code == 0 and '"loss": NaN' in out and '"step": 3' in out


def test_status_shows_the_benchmark_per_task_with_stderr_and_delta(deployed, hpctl, capsys, tmp_path):
    """Once the benchmark step wrote <run>/benchmark/benchmark.json: a row per task (a stderr lm-eval did not
    report shows as -)."""
    s3 = boto3.client("s3", region_name=REGION)
    write_run(s3, trainer_lines(capsys, tmp_path, step=3, total=10), estimate=None)
    code, out, _ = hpctl("status")
    assert code == 0 and "benchmark" not in out
    rows = [
        {"task": "gsm8k", "metric": "exact_match,strict-match", "shots": 5, "base": 0.5, "base_stderr": 0.0138,
         "tuned": 0.55, "tuned_stderr": 0.0137, "delta": 0.05},
        {"task": "ifeval", "metric": "prompt_level_strict_acc,none", "shots": 0, "base": 0.7, "base_stderr": None,
         "tuned": 0.65, "tuned_stderr": None, "delta": -0.05},
    ]  # fmt: skip
    put(s3, f"{BENCHMARK_DIR}/{BENCHMARK_JSON}", json.dumps({"tasks": rows, "serving": {}}))
    code, out, err = hpctl("status")
    assert (code, err) == (0, "")
    lines = out.split("  benchmark (<run>/benchmark/): task, metric, base ± stderr, tuned ± stderr, delta\n")[1]
    assert [line.split() for line in lines.splitlines()[:2]] == [
        ["gsm8k", "exact_match,strict-match", "0.5000", "±", "0.0138", "0.5500", "±", "0.0137", "+0.0500"],
        ["ifeval", "prompt_level_strict_acc,none", "0.7000", "±", "-", "0.6500", "±", "-", "-0.0500"],
    ]
    code, out, _ = hpctl("status", "--json")
    assert code == 0 and json.loads(out)["run"]["benchmark"] == rows
