"""The `hpctl nodes`, `node reboot|replace`, `health-check`, `events` and `drill` commands (HyperPod's node API, the
fault drill on the controller), and the room's registration (scale, operations and plans too)."""

from __future__ import annotations

import argparse
import dataclasses
import time

import botocore.session

from cluster_contract import StackOutput
from hpctl.common import ssm
from hpctl.common.cluster import list_nodes
from hpctl.common.deployment import connect, controller_request, deployed_cluster
from hpctl.common.facts import read_cluster_facts
from hpctl.common.prompt import confirm
from hpctl.common.registry import Room, RoomCommands
from hpctl.common.run_progress import check_run, list_runs, run_alerts
from hpctl.nodes import plans, scale_commands
from hpctl.nodes.drill import FAULTS, DrillOutput, drill_command, where_figures_are
from hpctl.nodes.node_api import (
    DEFAULT_HEALTH_CHECKS,
    NODE_ACTIONS,
    ClusterEvent,
    act_on_nodes,
    action_question,
    alert_event,
    by_time,
    cluster_events,
    follow_events,
    health_check_groups,
    render_events,
    render_nodes,
    resolve_nodes,
    start_health_check,
)

# The deep health checks HyperPod knows, from botocore's model (not retyped).
HEALTH_CHECKS = tuple(
    botocore.session.get_session().get_service_model("sagemaker").shape_for("DeepHealthCheckType").enum
)


FOLLOW_EVERY_S = 30  # ListClusterEvents and the run's alerts file, read again this often with --follow


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    asks = argparse.ArgumentParser(add_help=False)
    asks.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal)")

    nodes = sub.add_parser("nodes", parents=[common], help="every node: Slurm name, instance, group, state, health")
    nodes.set_defaults(handler=show_nodes)

    node = sub.add_parser("node", help="reboot or replace nodes (asks first)")
    actions = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    for verb, text in (
        ("reboot", "reboot nodes (soft recovery: the instance restarts, its disks stay)"),
        ("replace", "replace nodes with fresh instances (their local volumes are wiped)"),
    ):
        action = actions.add_parser(verb, parents=[common, asks], help=text)
        action.add_argument("names", nargs="+", metavar="NAME", help="Slurm name, instance id or logical id")
        action.set_defaults(handler=node_action, action=NODE_ACTIONS[verb])

    check = sub.add_parser(
        "health-check", parents=[common, asks], help="start HyperPod's deep health check on a group (asks first)"
    )
    check.add_argument("group", nargs="?", help="instance group (default: every GPU or Trainium group)")
    check.add_argument(
        "--check",
        dest="checks",
        action="append",
        choices=HEALTH_CHECKS,
        metavar="CHECK",
        help=f"a check to run, repeatable ({', '.join(HEALTH_CHECKS)}; default: {', '.join(DEFAULT_HEALTH_CHECKS)})",
    )
    check.set_defaults(handler=health_check)

    events = sub.add_parser("events", parents=[common], help="the cluster's events (continuous provisioning)")
    events.add_argument("--group", help="only this instance group")
    events.add_argument("--node", metavar="NAME", help="only this node (Slurm name, instance id or logical id)")
    events.add_argument("--limit", type=positive_int, default=50, metavar="N", help="newest N events (default 50)")
    events.add_argument("--run", metavar="RUN", help="with this run's alerts (its folder under outputs/)")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events and alerts (Ctrl-C)")
    events.add_argument(
        "--every", type=positive_int, default=FOLLOW_EVERY_S, metavar="S", help="--follow: seconds between reads"
    )
    events.set_defaults(handler=show_events)

    drill = sub.add_parser(
        "drill", parents=[common, asks], help="inject a fault into a run's train step to measure its recovery (asks)"
    )
    drill.add_argument("run", metavar="RUN", help="the run (its folder under outputs/)")
    faults = drill.add_mutually_exclusive_group(required=True)
    for fault, text in FAULTS.items():
        faults.add_argument(f"--{fault}", dest="fault", action="store_const", const=fault, help=text)
    drill.set_defaults(handler=run_drill)
    scale_commands.add_parsers(sub, common)
    plans.add_parser(sub, common)


ROOM = Room(
    "nodes",
    "list, reboot, replace, health-check and scale nodes; cluster events; the fault drill; training-plan offerings",
    register,
)


def show_nodes(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, _ = deployed_cluster(deployment)
    print(render_nodes(cluster, list_nodes(deployment.session, cluster.name, logical_ids=cluster.continuous)))


def node_action(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, controller_group = deployed_cluster(deployment)
    nodes = list_nodes(deployment.session, cluster.name, logical_ids=cluster.continuous)
    targets = resolve_nodes(args.names, nodes, cluster=cluster.name)
    confirm(action_question(args.action, cluster, targets, controller_group), yes=args.yes)
    sagemaker = deployment.session.client("sagemaker")
    print("\n".join(act_on_nodes(sagemaker, args.action, cluster, targets)))


def health_check(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, _ = deployed_cluster(deployment)
    groups = health_check_groups(cluster, args.group)
    checks = tuple(dict.fromkeys(args.checks or DEFAULT_HEALTH_CHECKS))
    confirm(
        f"run the deep health check ({', '.join(checks)}) on {', '.join(groups)} of cluster {cluster.name}; "
        "its nodes take no jobs until it ends, and HyperPod reboots or replaces each that fails?",
        yes=args.yes,
    )
    print(start_health_check(deployment.session.client("sagemaker"), cluster, groups, checks))


def show_events(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, _ = deployed_cluster(deployment)
    node_id = None
    if args.node:
        nodes = list_nodes(deployment.session, cluster.name, logical_ids=cluster.continuous)
        (node,) = resolve_nodes([args.node], nodes, cluster=cluster.name)
        node_id = node.instance_id
    sagemaker = deployment.session.client("sagemaker")
    s3 = deployment.session.client("s3")
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME) if args.run else ""

    def read() -> list[ClusterEvent]:
        events = cluster_events(sagemaker, cluster, limit=args.limit, group=args.group, node_id=node_id)
        alerts = [alert_event(alert) for alert in run_alerts(s3, bucket, args.run)] if args.run else []
        return by_time([*events, *alerts])[-args.limit :]

    shown = read()
    print(render_events(cluster, shown), flush=True)
    if args.follow:
        try:
            follow_events(
                read, shown=shown, poll_s=args.every, sleep=time.sleep, emit=lambda line: print(line, flush=True)
            )
        except KeyboardInterrupt:
            return


def run_drill(args: argparse.Namespace) -> None:
    ssm.find_session_tools()  # before any AWS call: the drill runs over an SSM session
    deployment = connect(args)
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME)
    runs = list_runs(deployment.session.client("s3"), bucket)
    check_run(args.run, runs, bucket)
    facts = read_cluster_facts(deployment.session, bucket)
    run_dir = f"{facts['outputs_dir']}/{args.run}"
    cluster, controller_group = deployed_cluster(deployment)
    confirm(f"{args.fault} drill on run {args.run} of cluster {cluster.name}: {FAULTS[args.fault]}?", yes=args.yes)
    request = controller_request(deployment, cluster, controller_group)
    command = drill_command(args.fault, run_dir=run_dir, payloads_dir=facts["payloads_dir"])
    output = DrillOutput()
    output.check(ssm.run_session(dataclasses.replace(request, command=command), output))
    print("\n".join(where_figures_are(args.run, run_dir=run_dir, bucket=bucket, fault=args.fault)))
