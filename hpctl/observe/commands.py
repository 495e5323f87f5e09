"""The `hpctl status`, `logs`, `metrics`, `dashboard` and `observability` commands: what the cluster and its runs
are doing, and the room's registration."""

from __future__ import annotations

import argparse
import dataclasses
import time

from cluster_contract import MANAGED_MODE, ObservabilityOutput, StackOutput
from hpctl.common import run_progress
from hpctl.common.arguments import count
from hpctl.common.cluster import describe_cluster, require_usable
from hpctl.common.deployment import Deployment, connect
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.pricing import pricing_client
from hpctl.common.project import read_cdk_context
from hpctl.common.registry import Room, RoomCommands
from hpctl.common.slurm_activity import slurm_activity
from hpctl.common.stack import StackInfo
from hpctl.observe import observability
from hpctl.observe.lifecycle_logs import find_log_group, show_lifecycle_logs
from hpctl.observe.status import collect_status, render_json, render_text
from hpctl.observe.step_logs import show_step_logs
from llm_pipeline.jobs import capacity


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    report = sub.add_parser("status", parents=[common], help="stack outputs, cluster, nodes, FSx and image")
    report.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    report.add_argument(
        "--slurm", action="store_true", help="also ask the controller (SSM) for Slurm's version and queue"
    )
    report.set_defaults(handler=status)

    logs = sub.add_parser("logs", help="lifecycle logs (CloudWatch) or pipeline step logs (S3)")
    kinds = logs.add_subparsers(dest="kind", required=True, metavar="KIND")
    lifecycle = kinds.add_parser("lifecycle", parents=[common], help="node lifecycle script logs")
    lifecycle.add_argument("--node", metavar="INSTANCE_ID_OR_GROUP", help="only this instance or instance group")
    lifecycle.add_argument(
        "--cluster", metavar="NAME", help="cluster name, when the stack is gone (default: the stack's cluster)"
    )
    lifecycle.add_argument("--tail", type=count, default=0, metavar="N", help="last N lines per node (0: all)")
    lifecycle.add_argument("--follow", "-f", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    lifecycle.set_defaults(handler=logs_lifecycle)
    steps = kinds.add_parser("steps", parents=[common], help="pipeline step logs of a run")
    steps.add_argument("run", nargs="?", help="run folder under outputs/ (omit to list runs)")
    steps.add_argument("log", nargs="?", help="log file, or a step name for its newest log (omit to list)")
    steps.add_argument("--tail", type=count, default=0, metavar="N", help="last N lines (0: all)")
    steps.set_defaults(handler=logs_steps)
    figures = sub.add_parser("metrics", parents=[common], help="a run's latest figures from the metrics workspace")
    figures.add_argument("run", metavar="RUN", help="the run's name (its run folder under outputs/)")
    figures.add_argument(
        "--endpoint", help="another Prometheus HTTP API (default: the stack's MetricsEndpoint, AMP with SigV4)"
    )
    figures.add_argument("--unsigned", action="store_true", help="send no SigV4 signature (a plain Prometheus)")
    figures.set_defaults(handler=metrics)
    board = sub.add_parser("dashboard", parents=[common], help="where the dashboard is and how to open it")
    board.set_defaults(handler=dashboard)
    extension = sub.add_parser("observability", help="observability = managed: AWS's cluster extension")
    actions = extension.add_subparsers(dest="observability_command", required=True, metavar="ACTION")
    enable = actions.add_parser("enable", parents=[common], help="install sagemaker-observability on the cluster")
    enable.add_argument("--version", help="the extension version (default: the one hpctl was tested with)")
    enable.set_defaults(handler=observability_enable)
    update = actions.add_parser(
        "update", parents=[common], help="list sagemaker-observability's versions; --version moves the cluster to one"
    )
    update.add_argument("--version", help="the version to move to (default: only list them)")
    update.set_defaults(handler=observability_update)


ROOM = Room("observe", "what the cluster and its runs are doing: status, logs, metrics, dashboards", register)


def status(args: argparse.Namespace) -> None:
    deployment = connect(args)
    stack = deployment.stack()
    report = collect_status(deployment.session, stack)
    report["observability"] = observability.health(deployment.session, stack)
    report["run"] = newest_run_status(deployment, stack)
    if args.slurm:
        report["slurm"] = slurm_report(deployment, stack)
    print(render_json(report) if args.json else render_text(report))


def slurm_report(deployment: Deployment, stack: StackInfo) -> dict:
    """Slurm's version and queue on the controller (over SSM), and for each group that scales with runs the
    node-hours it held since its first claim against as many always-on (the chains' usage ledger)."""
    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    activity = slurm_activity(deployment, cluster, stack.output(StackOutput.CONTROLLER_GROUP))
    running = sum(job.state == "RUNNING" for job in activity.jobs)
    now = time.time()
    saved = {}
    for group, usage in sorted(activity.usage.items()):
        held, always_on = capacity.node_hours(usage, now)
        saved[group] = {"held_node_hours": round(held, 3), "always_on_node_hours": round(always_on, 3)}
    failed = {group: capacity.failures(data) for group, data in sorted(activity.claims.items())}
    serving = []
    if activity.serving:
        root = deployment.settings.root
        types = run_progress.partition_instance_types(read_cdk_context(root) if (root / "cdk.json").is_file() else {})
        pricing = pricing_client(deployment.session)
        for job in activity.serving:
            instance_type = types.get(job.partition)
            price = run_progress.cluster_price(pricing, instance_type, deployment.region)
            cost = run_progress.describe_hourly(job.nodes, instance_type, price)
            serving.append({**dataclasses.asdict(job), "cost": cost})
    return {
        "version": activity.version,
        "running": running,
        "queued": len(activity.jobs) - running,
        "saved": saved,
        "capacity_failures": {group: lines for group, lines in failed.items() if lines},
        "serving": serving,
    }


def newest_run_status(deployment: Deployment, stack: StackInfo) -> dict | None:
    """The newest run's steps, progress and estimate (with its cost), from the bucket's outputs/."""
    bucket = stack.output(StackOutput.BUCKET_NAME)
    if not bucket:
        return None
    s3 = deployment.session.client("s3")
    with aws_errors(f"read the runs in s3://{bucket}/outputs/"):
        run = run_progress.newest_run(s3, bucket)
        if run is None:
            return None
        found = run_progress.run_progress(s3, bucket, run)
    estimate = found["estimate"]
    if estimate:
        root = deployment.settings.root
        context = read_cdk_context(root) if (root / "cdk.json").is_file() else {}
        instance_type = run_progress.partition_instance_types(context).get(estimate.partition)
        price = run_progress.cluster_price(pricing_client(deployment.session), instance_type, deployment.region)
        found["cost"] = run_progress.describe_cost(estimate.node_hours, instance_type, price)
    return found


def logs_lifecycle(args: argparse.Namespace) -> None:
    deployment = connect(args)
    group = find_log_group(deployment.session, stack_name=deployment.settings.stack_name, cluster_name=args.cluster)
    show_lifecycle_logs(deployment.session, group, node=args.node, tail=args.tail, follow=args.follow)


def logs_steps(args: argparse.Namespace) -> None:
    deployment = connect(args)
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME)
    show_step_logs(deployment.session, bucket, run=args.run, log=args.log, tail=args.tail)


def metrics(args: argparse.Namespace) -> None:
    if args.endpoint and args.unsigned:  # a plain Prometheus: no stack, region or credentials needed
        promql = observability.PromQL(args.endpoint, None, signed=False)
    else:
        deployment = connect(args)
        endpoint = args.endpoint or observability.endpoint_for(deployment.stack())
        promql = observability.PromQL(endpoint, deployment.session, signed=not args.unsigned)
    print(observability.render_figures(observability.run_figures(promql, args.run)))


def dashboard(args: argparse.Namespace) -> None:
    deployment = connect(args)
    stack = deployment.stack()
    print(
        observability.dashboard_text(
            root=deployment.settings.root,
            mode=observability.mode_of(stack),
            endpoint=stack.output(ObservabilityOutput.METRICS_ENDPOINT),
            region=deployment.region,
        )
    )


def managed_cluster(args: argparse.Namespace):
    """The session and the cluster's ARN of a stack in managed mode, with its cluster InService."""
    deployment = connect(args)
    stack = deployment.stack()
    mode = observability.mode_of(stack)
    if mode != MANAGED_MODE:
        raise HpctlError(
            f"stack {stack.name} has observability = {mode or 'not set'}: AWS's extension is for "
            f"observability = {MANAGED_MODE} (cdk.json, with provisioning = continuous), then `make deploy`"
        )
    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    require_usable(cluster, ready=True)
    return observability.sagemaker_client(deployment.session), cluster.arn


def observability_enable(args: argparse.Namespace) -> None:
    client, cluster_arn = managed_cluster(args)
    print(observability.enable_extension(client, cluster_arn, args.version or observability.EXTENSION_VERSION))


def observability_update(args: argparse.Namespace) -> None:
    client, cluster_arn = managed_cluster(args)
    print(observability.update_extension(client, cluster_arn, args.version))
