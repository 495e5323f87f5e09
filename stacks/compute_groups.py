"""Compute groups: the `compute_groups` context list, one HyperPod instance group and Slurm partition each.

In cdk.json it is a JSON list of objects; on the command line ``-c compute_groups='[{...}]'``
passes the same list as a JSON string. Every error names the group and the key, e.g.
``compute_groups[1] (gpu).capacity``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from stacks import ami_updates
from stacks.accelerators import INSTANCE_TYPES, REFUSED_INSTANCE_TYPES, instance_facts
from stacks.validation import StackConfigError, coerce, describe, entry_where, json_context

CONTEXT_KEY = "compute_groups"
ON_DEMAND, SPOT = "on-demand", "spot"
DEEP_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity")  # AWS::SageMaker::Cluster DeepHealthCheckType
# InstanceConnectivity tests the multi-node network between a group's nodes (NCCL/EFA), so it needs
# nodes that have one (EFA) and at least two of them (HyperPod developer guide, "Deep health checks").
CONNECTIVITY_CHECK = "InstanceConnectivity"
CONNECTIVITY_MIN_NODES = 2
# HyperPod's Slurm partition names (and instance group names) follow this pattern; "dev" is taken.
NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
TRAINING_PLAN_ARN = re.compile(r"arn:aws[a-z-]*:sagemaker:([a-z0-9-]+):([0-9]{12}):training-plan/[A-Za-z0-9-]+")
RESERVED_GROUP_NAMES = ("controller", "login")  # the controller and login groups use these
MAX_COUNT = 256
MAX_INSTANCE_TYPES = 20  # InstanceRequirements.InstanceTypes' maxItems (CloudFormation's schema, botocore's model)
EXAMPLE = '[{"name": "gpu", "instance_type": "ml.g5.12xlarge", "partition": "g5"}]'


@dataclass(frozen=True)
class ComputeGroup:
    """One compute instance group of the cluster; it is also one Slurm partition."""

    name: str = field(metadata=describe("instance group name (SSM targets and log streams use it)"))
    instance_type: str = field(metadata=describe("a type from stacks/accelerators.py, e.g. ml.p5.48xlarge"))
    partition: str = field(metadata=describe("the Slurm partition of this group's nodes"))
    instance_types: tuple[str, ...] = field(
        default=(),
        metadata=describe(
            "a flexible group: the types HyperPod may launch, in priority order (InstanceRequirements, up to "
            f"{MAX_INSTANCE_TYPES}), all of one accelerator lane and device count; instance_type is the first"
        ),
    )
    count: int = field(default=1, metadata=describe("nodes; 0 keeps the group (and partition) with no nodes"))
    min_instance_count: int = field(
        default=0,
        metadata=describe("continuous provisioning: nodes the group needs to be in service (MinInstanceCount)"),
    )
    capacity: str = field(default=ON_DEMAND, metadata=describe("on-demand or spot (HyperPod CapacityRequirements)"))
    training_plan_arn: str = field(
        default="", metadata=describe("a SageMaker training plan to run this group on (reserved capacity)")
    )
    ebs_volume_gb: int = field(default=500, metadata=describe("extra EBS volume per node, mounted at /opt/sagemaker"))
    threads_per_core: int = field(default=1, metadata=describe("1 (no hyper-threading) or 2"))
    deep_health_checks: tuple[str, ...] = field(
        default=(), metadata=describe("OnStartDeepHealthChecks: InstanceStress, InstanceConnectivity")
    )
    scale_with_runs: bool = field(
        default=False,
        metadata=describe(
            "capacity follows the pipeline: the group holds min_instance_count nodes (0 allowed) while no chain "
            "runs, and each chain claims its nodes (up to count) and gives them back when it ends; the way to stop "
            "paying for idle accelerators (continuous provisioning only)"
        ),
    )
    auto_patch: str = field(
        default="",
        metadata=describe(
            "AutoPatchConfig: HyperPod applies patch-level AMI releases to the group by itself, WhenIdle (each node "
            "once it runs no job) or WhenAllIdle (when no node of the group runs one), one node at a time; empty: "
            "no automatic patching"
        ),
    )
    scheduled_update: str = field(
        default="",
        metadata=describe(
            "ScheduledUpdateConfig: HyperPod moves the group to the newest AMI release on this schedule, a cron "
            "expression in UTC such as cron(0 3 ? * SUN *), one node at a time; empty: only when you run "
            "`hpctl update-software`"
        ),
    )

    @property
    def deployed_count(self) -> int:
        """InstanceCount in the template: the floor for a group that scales with runs (the chains add the rest
        through BatchAddClusterNodes, which a later deploy leaves alone: see stacks/update_safety.py), else count."""
        return self.min_instance_count if self.scale_with_runs else self.count

    @property
    def accelerator(self) -> str:
        return instance_facts(self.instance_type).accelerator

    @property
    def image_family(self) -> str:
        return instance_facts(self.instance_type).image_family

    @property
    def peak_tflops_per_device(self) -> float:
        return instance_facts(self.instance_type).peak_tflops_per_device

    @property
    def devices_per_node(self) -> int:
        return instance_facts(self.instance_type).devices

    @property
    def host_memory_gib(self) -> int:
        return instance_facts(self.instance_type).host_memory_gib

    @property
    def efa_interfaces(self) -> int:
        return instance_facts(self.instance_type).efa_interfaces

    @property
    def efa_device_rdma(self) -> bool:
        return instance_facts(self.instance_type).efa_device_rdma

    @property
    def supports_fp8(self) -> bool:
        return instance_facts(self.instance_type).supports_fp8


DEFAULT_COMPUTE_GROUPS = (ComputeGroup(name="compute", instance_type="ml.trn1.32xlarge", partition="trn1", count=1),)
GROUP_KEYS = tuple(f.name for f in dataclasses.fields(ComputeGroup))
REQUIRED_KEYS = ("name", "instance_type", "partition")


class GroupError(StackConfigError):
    """A bad compute group; the message names the group and the key."""

    @classmethod
    def at(cls, where: str, key: str, value: Any, allowed: str) -> GroupError:
        return cls(
            f"config key '{CONTEXT_KEY}' group {where}, key '{key}' has value {value!r}; allowed: {allowed}. "
            f"Fix it in cdk.json (context) or pass -c {CONTEXT_KEY}='<JSON list>'."
        )


def parse_compute_groups(raw: Any) -> tuple[ComputeGroup, ...]:
    """Context value (a list, or its JSON text from ``-c``) -> validated groups."""
    raw = json_context(CONTEXT_KEY, raw, f"; pass a list such as -c {CONTEXT_KEY}='{EXAMPLE}'")
    if not isinstance(raw, list) or not raw:
        raise StackConfigError.bad_value(
            CONTEXT_KEY, raw, "a non-empty list of group objects (see README, Compute groups)"
        )
    groups = tuple(_parse_group(index, item) for index, item in enumerate(raw))
    check_groups(groups)
    return groups


def _parse_group(index: int, item: Any) -> ComputeGroup:
    where = entry_where(index, item)
    if not isinstance(item, dict):
        raise GroupError.at(where, "-", item, "an object with name, instance_type, partition, ...")
    for key in item:
        if key not in GROUP_KEYS:
            close = difflib.get_close_matches(key, GROUP_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            known = ", ".join(GROUP_KEYS)
            raise GroupError(
                f"config key '{CONTEXT_KEY}' group {where}: unknown key '{key}'{hint}; known keys: {known}."
            )
    if isinstance(item.get("instance_types"), list) and item["instance_types"] and "instance_type" not in item:
        item = {**item, "instance_type": item["instance_types"][0]}  # a flexible group's facts: its first type
    missing = [key for key in REQUIRED_KEYS if key not in item]
    if missing:
        raise GroupError(f"config key '{CONTEXT_KEY}' group {where} lacks {', '.join(missing)}: every group names them")
    defaults = {f.name: f.default for f in dataclasses.fields(ComputeGroup)}
    values: dict[str, Any] = {}
    for key, value in item.items():
        if key == "deep_health_checks":
            values[key] = _health_checks(where, value)
        elif key == "instance_types":
            if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                raise GroupError.at(where, key, value, "a list of instance types in priority order")
            values[key] = tuple(value)
        else:
            default = defaults[key] if defaults[key] is not dataclasses.MISSING else ""
            try:
                values[key] = coerce(key, value, default)
            except StackConfigError:
                kind = "an integer" if isinstance(default, int) else "a string"
                raise GroupError.at(where, key, value, kind) from None
    group = ComputeGroup(**values)
    check_group(group, where)
    return group


def _health_checks(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or any(check not in DEEP_HEALTH_CHECKS for check in value):
        raise GroupError.at(where, "deep_health_checks", value, f"a list drawn from {', '.join(DEEP_HEALTH_CHECKS)}")
    if len(set(value)) != len(value):
        raise GroupError.at(where, "deep_health_checks", value, "each check at most once")
    return tuple(value)


def check_group(group: ComputeGroup, where: str) -> None:
    """Checks on one group; `where` says which (index and name) in every message."""

    def bad(key: str, allowed: str) -> GroupError:
        return GroupError.at(where, key, getattr(group, key), allowed)

    if not NAME_PATTERN.fullmatch(group.name) or group.name in RESERVED_GROUP_NAMES:
        raise bad("name", "letters and digits, inner hyphens, 63 at most, not controller or login")
    if group.instance_type in REFUSED_INSTANCE_TYPES:
        raise bad("instance_type", f"not {group.instance_type}: {REFUSED_INSTANCE_TYPES[group.instance_type]}")
    if group.instance_type not in INSTANCE_TYPES:
        raise bad("instance_type", "one of " + ", ".join(INSTANCE_TYPES) + " (the table in stacks/accelerators.py)")
    check_instance_types(group, bad)
    if not NAME_PATTERN.fullmatch(group.partition) or group.partition == "dev":
        raise bad(
            "partition",
            "letters and digits, inner hyphens allowed, 63 at most, and not 'dev' (HyperPod already puts every "
            "node in a partition of that name)",
        )
    if not 0 <= group.count <= MAX_COUNT:
        raise bad("count", f"an integer from 0 to {MAX_COUNT} (0 keeps the group with no nodes)")
    if not 0 <= group.min_instance_count <= group.count:
        raise bad(
            "min_instance_count",
            f"an integer from 0 to the group's count {group.count} (HyperPod rolls the group back when fewer than "
            "this many nodes arrive within 3 hours)",
        )
    if group.capacity not in (ON_DEMAND, SPOT):
        raise bad("capacity", f"{ON_DEMAND} or {SPOT}")
    if group.training_plan_arn:
        if not TRAINING_PLAN_ARN.fullmatch(group.training_plan_arn):
            raise bad("training_plan_arn", "arn:aws:sagemaker:<region>:<account>:training-plan/<name>, or empty")
        if group.capacity == SPOT:
            # A training plan is reserved capacity paid up front; Spot is EC2's spare pool. HyperPod's
            # API and schema document no way to combine them, so the group must say which it runs on.
            raise bad("capacity", f"{ON_DEMAND} when training_plan_arn is set (the plan's reserved capacity is used)")
    if not 1 <= group.ebs_volume_gb <= 16384:
        raise bad("ebs_volume_gb", "an integer from 1 to 16384")
    if group.threads_per_core not in (1, 2):
        raise bad("threads_per_core", "1 or 2")
    if group.deep_health_checks and not instance_facts(group.instance_type).accelerated:
        raise bad(
            "deep_health_checks",
            f"none on {group.instance_type}: HyperPod runs deep health checks on GPU and Trainium instances only",
        )
    if group.auto_patch and group.auto_patch not in ami_updates.patching_strategies():
        raise bad(
            "auto_patch",
            f"empty or one of {', '.join(ami_updates.patching_strategies())} (AutoPatchConfig's strategies in "
            "CloudFormation's schema)",
        )
    if group.scheduled_update and not ami_updates.schedule_pattern().fullmatch(group.scheduled_update):
        raise bad(
            "scheduled_update",
            "empty or a cron expression CloudFormation accepts: cron(minute hour day-of-month month day-of-week "
            "year), e.g. cron(0 3 ? * SUN *)",
        )
    if group.scale_with_runs and not group.count:
        raise bad("count", "1 or more with scale_with_runs = true (count is the most nodes the chains may claim)")
    if CONNECTIVITY_CHECK in group.deep_health_checks:
        if not group.efa_interfaces:
            raise bad(
                "deep_health_checks",
                f"no {CONNECTIVITY_CHECK} on {group.instance_type}: it tests the multi-node network and this type "
                "has no EFA; keep InstanceStress, or pick a type with EFA (stacks/accelerators.py)",
            )
        if group.count == 1:
            raise bad(
                "deep_health_checks",
                f"no {CONNECTIVITY_CHECK} with count 1: it tests the network between the group's nodes, so it "
                f"needs at least {CONNECTIVITY_MIN_NODES} (count 0 keeps the group empty until you scale it)",
            )


def check_instance_types(group: ComputeGroup, bad) -> None:
    """A flexible group runs one image and one device count whatever type comes: its types share both."""
    types = group.instance_types
    if not types:
        return
    if not 1 <= len(types) <= MAX_INSTANCE_TYPES or len(set(types)) != len(types):
        raise bad("instance_types", f"1 to {MAX_INSTANCE_TYPES} distinct types, in priority order")
    if types[0] != group.instance_type:
        raise bad("instance_types", f"a list whose first type is instance_type ({group.instance_type}), or leave "
                  "instance_type out")  # fmt: skip
    for name in types:
        if name in REFUSED_INSTANCE_TYPES or name not in INSTANCE_TYPES:
            raise bad("instance_types", f"types from the table in stacks/accelerators.py ({name} is not one)")
    first = instance_facts(types[0])
    for name in types[1:]:
        facts = instance_facts(name)
        if facts.image_family != first.image_family:
            raise bad("instance_types", f"types of one accelerator lane (one image per group): {name} runs the "
                      f"{facts.image_family} image, {types[0]} {first.image_family}: make two groups")  # fmt: skip
        if facts.devices != first.devices:
            raise bad("instance_types", f"types with as many devices per node: {name} has {facts.devices} and "
                      f"{types[0]} {first.devices} (a run's ranks per node would change with the type)")  # fmt: skip


def check_groups(groups: tuple[ComputeGroup, ...]) -> None:
    """Checks across groups: names and partitions are unique."""
    for key in ("name", "partition"):
        seen: dict[str, int] = {}
        for index, group in enumerate(groups):
            value = getattr(group, key)
            if value in seen:
                raise GroupError.at(
                    f"[{index}] ({group.name})",
                    key,
                    value,
                    f"a {key} no other group uses (group [{seen[value]}] already has it)",
                )
            seen[value] = index


def check_training_plan_region(groups: tuple[ComputeGroup, ...], region: str) -> None:
    """A training plan reserves capacity in one region: the stack's."""
    for index, group in enumerate(groups):
        match = TRAINING_PLAN_ARN.fullmatch(group.training_plan_arn) if group.training_plan_arn else None
        if match and match.group(1) != region:
            raise GroupError.at(
                f"[{index}] ({group.name})",
                "training_plan_arn",
                group.training_plan_arn,
                f"a plan in the stack's region {region} (this one is in {match.group(1)})",
            )
