"""What only AWS knows, checked by predeploy when credentials exist (offline it says they were skipped).

- The Availability Zone ID exists in the region (EC2 DescribeAvailabilityZones).
- The zone offers each compute group's instance type (EC2 DescribeInstanceTypeOfferings of the type
  without its ``ml.`` prefix, the closest public signal of where SageMaker has it). A group on a training
  plan is judged by its plan's zone instead, and a type EC2 lists in no zone is left to the deploy.
- Each group's training plan (SageMaker DescribeTrainingPlan): it serves HyperPod clusters, is not
  expired, failed or still pending, has enough instances not in use elsewhere, and reserves the
  group's instance type, enough instances, in the stack's zone (a plan's capacity lives in one
  Availability Zone).
- Service quotas: per instance type, the nodes of every group of that type (controller and login
  included) against the account's "<type> for cluster usage" quota (Service Quotas, service code
  sagemaker). A type without such a quota is not judged.

Each message names the config key and what to do. Only the cluster lane is checked: the jobs lane
creates no cluster.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

import boto3
from botocore.exceptions import ClientError

from stacks.compute_groups import CONTEXT_KEY as GROUPS_KEY
from stacks.config import HyperPodConfig

SERVICE_CODE = "sagemaker"
CLUSTER_QUOTA_SUFFIX = " for cluster usage"
CLUSTER_TARGET = "hyperpod-cluster"  # TrainingPlan TargetResources value for HyperPod
UNUSABLE_PLAN_STATES = ("Expired", "Failed")
PENDING_PLAN_STATE = "Pending"  # bought but not yet confirmed: it reserves nothing yet
EC2_TYPE_PREFIX = "ml."  # SageMaker's ml.<type> runs on EC2's <type>


def zone_refusals(config: HyperPodConfig, session: boto3.Session) -> list[str]:
    zones = session.client("ec2").describe_availability_zones(AllAvailabilityZones=True)["AvailabilityZones"]
    ids = sorted(zone["ZoneId"] for zone in zones)
    if config.availability_zone_id in ids:
        return []
    return [
        f"config key 'availability_zone_id' has value {config.availability_zone_id!r}, which is not a zone of "
        f"{config.region} in this account; its zone IDs: {', '.join(ids)}"
    ]


def zones_offering(session: boto3.Session, instance_types: Iterable[str]) -> dict[str, set[str]]:
    """The zone IDs of the session's region where EC2 offers each SageMaker type (asked by its EC2 name)."""
    types = sorted(set(instance_types))
    ec2_names = {instance_type: instance_type.removeprefix(EC2_TYPE_PREFIX) for instance_type in types}
    zones: dict[str, set[str]] = {name: set() for name in ec2_names.values()}
    pages = (
        session.client("ec2")
        .get_paginator("describe_instance_type_offerings")
        .paginate(
            LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": list(ec2_names.values())}]
        )
    )
    for page in pages:
        for offering in page["InstanceTypeOfferings"]:
            zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])
    return {instance_type: zones[name] for instance_type, name in ec2_names.items()}


def offering_refusals(config: HyperPodConfig, session: boto3.Session) -> list[str]:
    groups = [(index, group) for index, group in enumerate(config.compute_groups) if not group.training_plan_arn]
    if not groups:
        return []
    offered = zones_offering(session, (group.instance_type for _, group in groups))
    zone = config.availability_zone_id
    messages = []
    for index, group in groups:
        zones = offered[group.instance_type]
        if not zones:
            print(
                f"note: predeploy could not check zone {zone} for {group.instance_type}: EC2 lists it in no zone of "
                f"{config.region}",
                file=sys.stderr,
            )
        elif zone not in zones:
            messages.append(
                f"config key '{GROUPS_KEY}' group [{index}] ({group.name}): availability_zone_id {zone} does not "
                f"offer {group.instance_type}; zones of {config.region} that do: {', '.join(sorted(zones))} (set "
                "availability_zone_id to one that offers every group's type, or change this group's instance_type)"
            )
    return messages


def _plan(session: boto3.Session, arn: str) -> dict[str, Any] | None:
    try:
        return session.client("sagemaker").describe_training_plan(TrainingPlanName=arn.rsplit("/", 1)[-1])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ValidationException"):
            return None
        raise


def training_plan_refusals(config: HyperPodConfig, session: boto3.Session) -> list[str]:
    messages = []
    for index, group in enumerate(config.compute_groups):
        if not group.training_plan_arn:
            continue
        where = f"config key '{GROUPS_KEY}' group [{index}] ({group.name}), key 'training_plan_arn'"
        plan = _plan(session, group.training_plan_arn)
        if plan is None:
            messages.append(f"{where}: no training plan {group.training_plan_arn} in this account and region")
            continue
        problems = []
        if CLUSTER_TARGET not in plan.get("TargetResources", []):
            problems.append(f"it serves {', '.join(plan.get('TargetResources', [])) or 'nothing'}, not HyperPod")
        if plan.get("Status") in UNUSABLE_PLAN_STATES:
            problems.append(f"it is {plan['Status']}")
        elif plan.get("Status") == PENDING_PLAN_STATE:
            problems.append(
                f"it is {PENDING_PLAN_STATE} (not yet confirmed: deploy once `aws sagemaker "
                "describe-training-plan` says Scheduled or Active)"
            )
        available = plan.get("AvailableInstanceCount")
        if available is not None and plan.get("InUseInstanceCount") and group.count > available:
            problems.append(
                f"only {available} of its {plan.get('TotalInstanceCount', '?')} instances are free "
                f"({plan['InUseInstanceCount']} in use elsewhere), fewer than count {group.count}"
            )
        summaries = plan.get("ReservedCapacitySummaries", [])
        reserved = [r for r in summaries if r.get("InstanceType") == group.instance_type]
        if not reserved:
            types = sorted({r.get("InstanceType", "?") for r in summaries})
            problems.append(f"it reserves {', '.join(types) or 'no instances'}, not {group.instance_type}")
        else:
            zones = sorted({r.get("AvailabilityZoneId", "?") for r in reserved})
            if config.availability_zone_id not in zones:
                problems.append(
                    f"its capacity is in zone {', '.join(zones)}, not the stack's availability_zone_id "
                    f"{config.availability_zone_id} (a plan's capacity lives in one zone: set availability_zone_id "
                    "to it, or use a plan in this zone)"
                )
            total = sum(r.get("TotalInstanceCount", 0) for r in reserved)
            if group.count > total:
                problems.append(f"it reserves {total} x {group.instance_type}, fewer than count {group.count}")
        if problems:
            messages.append(f"{where}: plan {plan.get('TrainingPlanName', '?')}: " + "; ".join(problems))
    return messages


def cluster_quotas(session: boto3.Session) -> dict[str, float]:
    """The account's "<instance type> for cluster usage" quotas in the session's region."""
    paginator = session.client("service-quotas").get_paginator("list_service_quotas")
    quotas = {}
    for page in paginator.paginate(ServiceCode=SERVICE_CODE):
        for quota in page["Quotas"]:
            name = quota.get("QuotaName", "")
            if name.endswith(CLUSTER_QUOTA_SUFFIX):
                quotas[name.removesuffix(CLUSTER_QUOTA_SUFFIX)] = quota["Value"]
    return quotas


def quota_wanted(config: HyperPodConfig) -> Counter[str]:
    """Nodes per instance type that count against the cluster-usage quotas (controller and login included)."""
    wanted: Counter[str] = Counter({config.controller_instance_type: config.controller_instance_count})
    wanted[config.login_instance_type] += config.login_instance_count
    for group in config.compute_groups:
        if not group.training_plan_arn:  # groups on a training plan are judged against the plan (above)
            wanted[group.instance_type] += group.count
    return +wanted  # drops the types wanted 0 times (no login node)


def quota_increase_hint() -> str:
    return f"Service Quotas console, or aws service-quotas request-service-quota-increase --service-code {SERVICE_CODE}"


def quota_refusals(config: HyperPodConfig, session: boto3.Session) -> list[str]:
    wanted = quota_wanted(config)
    quotas = cluster_quotas(session)
    return [
        f"config key '{GROUPS_KEY}': {count} x {instance_type} wanted, but this account's quota "
        f"'{instance_type}{CLUSTER_QUOTA_SUFFIX}' in {config.region} is {quota:g}; lower the count, or ask for "
        f"more ({quota_increase_hint()})"
        for instance_type, count in sorted(wanted.items())
        if (quota := quotas.get(instance_type)) is not None and count > quota
    ]


DENIED_CODES = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")
CHECKS = (
    ("the zone ID", zone_refusals),
    ("the zone's instance types", offering_refusals),
    ("the training plans", training_plan_refusals),
    ("the service quotas", quota_refusals),
)


def online_refusals(config: HyperPodConfig, session: boto3.Session) -> list[str]:
    """Every online check of the cluster lane; empty for a jobs-only config. A check the credentials
    may not make (access denied) is skipped with a note: the deploy itself will tell."""
    if not config.cluster_lane:
        return []
    messages: list[str] = []
    for what, check in CHECKS:
        try:
            messages += check(config, session)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in DENIED_CODES:
                raise
            print(f"note: predeploy could not check {what}: {error}", file=sys.stderr)
    return messages
