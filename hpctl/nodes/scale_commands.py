"""The `hpctl scale` and `hpctl operations` commands (HyperPod's node API, continuous provisioning)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

from hpctl.common.arguments import count
from hpctl.common.deployment import connect, deployed_cluster
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.prompt import confirm
from hpctl.common.registry import RoomCommands
from hpctl.common.slurm_activity import SlurmActivity, slurm_activity
from hpctl.nodes.scaling import (
    OPERATIONS_MAX,
    OPERATIONS_PAGE,
    in_progress,
    list_operations,
    operation_detail,
    plan_scale,
    render_operations,
)
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.capacity import HyperPodScaler


def page_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= OPERATIONS_MAX:
        raise argparse.ArgumentTypeError(f"must be 1 to {OPERATIONS_MAX}, got {text}")
    return value


def add_parsers(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    scale = sub.add_parser(
        "scale", parents=[common], help="set a group's node count now (BatchAdd/BatchDeleteClusterNodes; asks first)"
    )
    scale.add_argument("group", help="instance group")
    scale.add_argument("count", type=count, help="nodes the group should have (0 allowed)")
    scale.add_argument("--force", action="store_true", help="also remove nodes that run a job (their jobs fail)")
    scale.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal)")
    scale.set_defaults(handler=scale_group)

    operations = sub.add_parser(
        "operations", parents=[common], help="the cluster's scaling and health-check operations"
    )
    operations.add_argument("--follow", "-f", action="store_true", help="poll until none is in progress")
    operations.add_argument("--interval", type=float, default=15, metavar="SECONDS", help="poll every (default 15)")
    operations.add_argument(
        "--limit", type=page_size, default=OPERATIONS_PAGE, metavar="N", help=f"newest N (default {OPERATIONS_PAGE})"
    )
    operations.set_defaults(handler=show_operations)


@contextlib.contextmanager
def scaler_errors() -> Iterator[None]:
    """The scaler's StepError (it names the call, the group and AWS's answer or HyperPod's refusal) as hpctl's."""
    try:
        yield
    except StepError as error:
        raise HpctlError(str(error)) from error


def scale_group(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, controller_group = deployed_cluster(deployment)
    sagemaker = deployment.session.client("sagemaker")
    scaler = HyperPodScaler(cluster.name, client=sagemaker)
    with aws_errors(f"list the nodes of group {args.group}"), scaler_errors():
        up = scaler.in_service(args.group)
    # Only a removal needs to know what runs where.
    activity = slurm_activity(deployment, cluster, controller_group) if args.count < len(up) else SlurmActivity()
    plan = plan_scale(cluster, args.group, args.count, up, activity, force=args.force)
    if not (plan.add or plan.remove):
        print(plan.describe(cluster.name))
        return
    warning = f"; {', '.join(plan.busy)} run(s) a job that fails" if plan.busy else ""
    confirm(f"{plan.describe(cluster.name)}{warning}?", yes=args.yes)
    refused: dict[str, str] = {}
    with aws_errors(f"scale group {args.group}"), scaler_errors():
        if plan.add:
            scaler.add(args.group, plan.add)
        else:
            refused = scaler.remove(args.group, plan.remove)
    if refused:
        raise HpctlError(
            f"HyperPod refused to remove {len(refused)} of {len(plan.remove)} node(s) of group {args.group}: "
            + "; ".join(f"{node}: {why}" for node, why in refused.items())
        )
    print(f"{plan.describe(cluster.name)}: requested; `.venv/bin/hpctl operations --follow` follows it")


def show_operations(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, _ = deployed_cluster(deployment)
    sagemaker = deployment.session.client("sagemaker")
    with aws_errors(f"list the operations of cluster {cluster.name}"):
        operations = list_operations(sagemaker, cluster.name, args.limit)
        details = {op: operation_detail(sagemaker, cluster.name, op) for op in in_progress(operations)}
    print(render_operations(operations, details), flush=True)
    watched = {op: "InProgress" for op in in_progress(operations)}
    while args.follow and watched:
        time.sleep(args.interval)
        with aws_errors(f"list the operations of cluster {cluster.name}"):
            operations = list_operations(sagemaker, cluster.name, args.limit)
        for op in operations:
            if op["OperationId"] in watched and op.get("Status") != watched[op["OperationId"]]:
                print(f"{op['OperationId']} {op.get('Type', '-')} {watched[op['OperationId']]} -> {op['Status']}")
                watched[op["OperationId"]] = op["Status"]
        watched = {op: status for op, status in watched.items() if status == "InProgress"}
        if not watched:
            print("no operation in progress", flush=True)
