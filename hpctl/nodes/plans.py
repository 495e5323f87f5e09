"""`hpctl plans --find TYPE COUNT --hours N`: the training-plan offerings SageMaker has for a HyperPod cluster
(SearchTrainingPlanOfferings), earliest start first. The request is built from botocore's model of the call (its
instance type and target enums, its count and duration bounds), so what AWS would refuse is refused here first."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from functools import cache

import botocore.session

from hpctl.common.deployment import connect
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.registry import RoomCommands
from hpctl.common.table import format_table
from stacks.accelerators import INSTANCE_TYPES

SEARCH = "SearchTrainingPlanOfferings"
TARGET = "hyperpod-cluster"  # a plan for a cluster's instance group (not training jobs or endpoints)


@cache
def search_shape():
    return botocore.session.get_session().get_service_model("sagemaker").operation_model(SEARCH).input_shape


def search_request(instance_type: str, count: int, hours: int) -> dict:
    """The search's parameters, refused in one line where the accelerator table or botocore's model says no."""
    members = search_shape().members
    if instance_type not in INSTANCE_TYPES:
        raise HpctlError(f"--find: {instance_type} has no row in the accelerator table (stacks/accelerators.py)")
    reservable = members["InstanceType"].enum
    if instance_type not in reservable:
        offered = ", ".join(t for t in reservable if t in INSTANCE_TYPES)
        raise HpctlError(f"--find: training plans do not reserve {instance_type} ({SEARCH}); they reserve {offered}")
    targets = members["TargetResources"].member.enum
    if TARGET not in targets:
        raise HpctlError(
            f"botocore's {SEARCH} knows no target {TARGET} (only {', '.join(targets)}): update botocore (make hpctl)"
        )
    for flag, name, value in (("--find COUNT", "InstanceCount", count), ("--hours", "DurationHours", hours)):
        low, top = max(1, members[name].metadata.get("min", 1)), members[name].metadata["max"]  # 0 nodes: no plan
        if not low <= value <= top:
            raise HpctlError(f"{flag}: {value} is out of range: {low} to {top} ({SEARCH}'s {name})")
    return {"InstanceType": instance_type, "InstanceCount": count, "DurationHours": hours, "TargetResources": [TARGET]}


def fee(offering: dict) -> Decimal | None:
    try:
        return Decimal(offering.get("UpfrontFee", ""))
    except InvalidOperation:
        return None


def start(offering: dict) -> datetime | None:
    starts = [c["StartTime"] for c in offering.get("ReservedCapacityOfferings", []) if "StartTime" in c]
    return min(starts, default=None)


def order(offering: dict) -> tuple:
    """Earliest start first, then the lowest fee; offerings without a start or a fee last."""
    when, price = start(offering), fee(offering)
    return (when is None, when.timestamp() if when else 0.0, price is None, price or Decimal(0))


def duration(offering: dict) -> str:
    hours, minutes = offering.get("DurationHours", 0), offering.get("DurationMinutes", 0)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"


def rows(offerings: list[dict], count: int) -> list[list[str]]:
    table = []
    for offering in sorted(offerings, key=order):
        capacity = offering.get("ReservedCapacityOfferings", [])
        when, price = start(offering), fee(offering)
        hours = offering.get("DurationHours", 0) + offering.get("DurationMinutes", 0) / 60
        per_node_hour = f"{price / Decimal(str(count * hours)):.2f}" if price is not None and count * hours else "-"
        currency = offering.get("CurrencyCode", "")
        table.append(
            [
                offering["TrainingPlanOfferingId"],
                f"{when.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC" if when else "-",
                duration(offering),
                f"{offering.get('UpfrontFee', '-')} {currency}".strip(),
                f"{per_node_hour} {currency}".strip() if per_node_hour != "-" else "-",
                ", ".join(sorted({c["AvailabilityZone"] for c in capacity if "AvailabilityZone" in c})) or "-",
                ", ".join(f"{c.get('InstanceCount', '?')} x {c.get('InstanceType', '?')}" for c in capacity) or "-",
            ]
        )
    return table


def find_plans(args: argparse.Namespace) -> None:
    instance_type, count_text = args.find
    try:
        count = int(count_text)
    except ValueError:
        raise HpctlError(f"--find COUNT: a whole number of nodes, not {count_text!r}") from None
    request = search_request(instance_type, count, args.hours)
    session = connect(args).session
    with aws_errors(f"search training-plan offerings for {count} x {instance_type}"):
        offerings = session.client("sagemaker").search_training_plan_offerings(**request)["TrainingPlanOfferings"]
    what = f"{count} x {instance_type} for {args.hours} hours in {session.region_name}"
    if not offerings:
        print(f"no training-plan offering for {what}: try fewer nodes, fewer hours or another region")
        return
    header = ["OFFERING", "START", "DURATION", "UPFRONT FEE", "PER NODE-HOUR", "ZONE", "CAPACITY"]
    print(f"training-plan offerings for {what} (a HyperPod cluster's group), earliest start first:")
    print(format_table(header, rows(offerings, count)))
    print(
        "reserve one with `aws sagemaker create-training-plan --training-plan-offering-id OFFERING "
        "--training-plan-name NAME`, then name its ARN in the group's training_plan_arn (its zone must be the stack's)"
    )


def add_parser(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    plans = sub.add_parser(
        "plans", parents=[common], help="training-plan offerings for a group: price, start, duration, zone"
    )
    plans.add_argument(
        "--find",
        nargs=2,
        metavar=("TYPE", "COUNT"),
        required=True,
        help="COUNT nodes of TYPE (a type training plans reserve, e.g. ml.p5.48xlarge)",
    )
    plans.add_argument("--hours", type=int, required=True, metavar="N", help="how long the plan runs, in hours")
    plans.set_defaults(handler=find_plans)
