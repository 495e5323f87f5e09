"""What a config change does to a deployed stack, decided from two templates and CloudFormation's schemas.

A resource is replaced when a create-only property changes (the list comes from the resource
schemas cfn-lint ships, never retyped), or when it refers to a resource that is replaced through
such a property. A replacement is refused by CloudFormation when the resource keeps a fixed name
("cannot update a stack when a custom-named resource requires replacing"), and by FSx when a new
data repository association would take the same path on the same file system as the old one
(CloudFormation creates the new one before deleting the old one).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

from cluster_contract import FSX_FOLDER_FACTS, PROMETHEUS_MODE, fsx_dir
from stacks.compute_groups import SPOT
from stacks.storage import DATA_LINKS

SCHEMA_REGION = "us-east-1"  # cfn-lint's reference schemas; create-only lists do not vary by region
IN_PLACE, REPLACED, FORBIDDEN = "in place", "replaced", "forbidden"
SEVERITY = {"none": 0, IN_PLACE: 1, REPLACED: 2, FORBIDDEN: 3}
DRA_TYPE = "AWS::FSx::DataRepositoryAssociation"


@dataclass(frozen=True)
class ResourceChange:
    logical_id: str
    resource_type: str
    action: str  # added, removed, in place, replaced, forbidden
    why: str

    def line(self) -> str:
        return f"{self.logical_id} ({self.resource_type}): {self.action}: {self.why}"


def create_only_paths(resource_type: str) -> list[tuple[str, ...]]:
    """Create-only property paths of a resource type, e.g. ('LustreConfiguration', 'DeploymentType')."""
    if resource_type.startswith("Custom::") or resource_type == "AWS::CloudFormation::CustomResource":
        return []
    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(SCHEMA_REGION, resource_type).schema
    paths = []
    for pointer in schema.get("createOnlyProperties", []):
        parts = pointer.split("/")[2:]  # "/properties/A/B" -> ["A", "B"]
        paths.append(tuple(parts))
    return paths


_MISSING = object()


def _at(properties: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = properties
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def references(value: Any) -> Iterator[str]:
    """Logical ids a template value refers to (Ref, Fn::GetAtt, ${X} in Fn::Sub)."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                yield inner
            elif key == "Fn::GetAtt":
                target = inner[0] if isinstance(inner, list) else str(inner).split(".")[0]
                yield target
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                for piece in str(text).split("${")[1:]:
                    yield piece.split("}")[0].split(".")[0]
                yield from references(inner)
            else:
                yield from references(inner)
    elif isinstance(value, list):
        for item in value:
            yield from references(item)


def _fixed_name(resource_type: str, properties: Mapping[str, Any]) -> str:
    """The literal create-only name the resource keeps (BucketName, ClusterName, ...), if any."""
    for path in create_only_paths(resource_type):
        if path[-1].endswith("Name") and len(path) == 1 and isinstance(properties.get(path[0]), str):
            return f"{path[0]}={properties[path[0]]}"
    return ""


def classify(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[ResourceChange]:
    """Every resource a deploy of ``after`` over ``before`` adds, removes, updates or replaces."""
    old, new = before.get("Resources", {}), after.get("Resources", {})
    changes: dict[str, ResourceChange] = {}
    for logical_id in sorted(set(old) | set(new)):
        if logical_id not in old:
            changes[logical_id] = ResourceChange(logical_id, new[logical_id]["Type"], "added", "new in the template")
        elif logical_id not in new:
            changes[logical_id] = ResourceChange(logical_id, old[logical_id]["Type"], "removed", "gone from it")
        elif old[logical_id]["Type"] != new[logical_id]["Type"]:
            changes[logical_id] = ResourceChange(logical_id, new[logical_id]["Type"], REPLACED, "its type changed")
    replaced = {i for i, c in changes.items() if c.action in (REPLACED, "removed")}
    while True:  # a replacement gives a new id to whatever refers to it: propagate until nothing moves
        found = False
        for logical_id in sorted(set(old) & set(new)):
            if logical_id in replaced:
                continue
            kind = new[logical_id]["Type"]
            was, now = old[logical_id].get("Properties", {}), new[logical_id].get("Properties", {})
            for path in create_only_paths(kind):
                before_value, after_value = _at(was, path), _at(now, path)
                moved = set(references(after_value)) & replaced
                if before_value != after_value or moved:
                    why = f"create-only {'.'.join(path)} " + (
                        "changes" if before_value != after_value else f"refers to replaced {', '.join(sorted(moved))}"
                    )
                    changes[logical_id] = ResourceChange(logical_id, kind, REPLACED, why)
                    replaced.add(logical_id)
                    found = True
                    break
        if not found:
            break
    for logical_id in sorted(set(old) & set(new)):
        if logical_id in changes:
            continue
        was, now = old[logical_id].get("Properties", {}), new[logical_id].get("Properties", {})
        moved = set(references(now)) & replaced
        differing = sorted(key for key in set(was) | set(now) if was.get(key) != now.get(key))
        if differing or moved:
            why = f"{', '.join(differing)} change" if differing else f"refers to replaced {', '.join(sorted(moved))}"
            changes[logical_id] = ResourceChange(logical_id, new[logical_id]["Type"], IN_PLACE, why)
    return [_refusal(change, old, new, replaced) for change in changes.values()]


def _refusal(change: ResourceChange, old: Mapping, new: Mapping, replaced: set[str]) -> ResourceChange:
    if change.action != REPLACED:
        return change
    was, now = old[change.logical_id].get("Properties", {}), new[change.logical_id].get("Properties", {})
    name = _fixed_name(change.resource_type, now)
    if name and name == _fixed_name(change.resource_type, was):
        why = f"{change.why}, but it keeps its fixed name {name}: CloudFormation cannot replace a custom-named resource"
        return ResourceChange(change.logical_id, change.resource_type, FORBIDDEN, why)
    if change.resource_type == DRA_TYPE:
        same_path = was.get("FileSystemPath") == now.get("FileSystemPath")
        same_file_system = was.get("FileSystemId") == now.get("FileSystemId") and not (
            set(references(now.get("FileSystemId"))) & replaced
        )
        if same_path and same_file_system:
            why = (
                f"{change.why}: the new association is created before the old one is deleted, on the same path "
                f"{now.get('FileSystemPath')} of the same file system, which FSx refuses (paths may not overlap)"
            )
            return ResourceChange(change.logical_id, change.resource_type, FORBIDDEN, why)
    return change


def verdict(changes: list[ResourceChange]) -> str:
    """The worst outcome: forbidden, replaced, in place, or none."""
    worst = "none"
    for change in changes:
        action = IN_PLACE if change.action in ("added", "removed") else change.action
        if SEVERITY[action] > SEVERITY[worst]:
            worst = action
    return worst


# What changing each config key does to a deployed stack; tests/infra/test_infra_update_safety.py
# derives each verdict from synthesized templates and fails when this table says otherwise.
NEW_STACK, FIXED = "new stack", "fixed"


@dataclass(frozen=True)
class KeyBehaviour:
    verdict: str  # in place, replaced, forbidden, new stack, fixed
    note: str  # what happens, and for a forbidden key what to do instead

    def readme(self) -> str:
        return f"{self.verdict}: {self.note}" if self.note else self.verdict


DESTROY_FIRST = "`make destroy` (retain_outputs keeps the bucket), then deploy"
KEY_BEHAVIOUR: dict[str, KeyBehaviour] = {
    "stack_name": KeyBehaviour(
        FORBIDDEN, "a second stack whose bucket and cluster names collide; change name_prefix too"
    ),
    "name_prefix": KeyBehaviour(
        FORBIDDEN, f"the bucket is replaced and FSx refuses new data links on the same paths; {DESTROY_FIRST}"
    ),
    "account": KeyBehaviour(NEW_STACK, "a separate stack in that account"),
    "region": KeyBehaviour(NEW_STACK, "a separate stack in that region"),
    "availability_zone_id": KeyBehaviour(
        FORBIDDEN, f"replaces the subnets, FSx (its data) and the fixed-name cluster; {DESTROY_FIRST}"
    ),
    "vpc_cidr": KeyBehaviour(
        FORBIDDEN, f"replaces the VPC, FSx (its data) and the fixed-name cluster; {DESTROY_FIRST}"
    ),
    "controller_instance_type": KeyBehaviour(
        IN_PLACE,
        "the template allows it, but HyperPod replaces the controller node with its Slurm state, so predeploy "
        "refuses it without `--allow-controller-replace`",
    ),
    "controller_instance_count": KeyBehaviour(FIXED, "only 1 is allowed"),
    "login_instance_type": KeyBehaviour(IN_PLACE, ""),
    "login_instance_count": KeyBehaviour(IN_PLACE, ""),
    "compute_groups": KeyBehaviour(
        IN_PLACE,
        "every group key and adding a group, except: a group's capacity (on-demand or spot) is fixed once created, "
        "and removing or renaming a group needs `--allow-remove-group NAME`; a group with scale_with_runs deploys its "
        "floor (min_instance_count), and predeploy refuses a deploy while chains hold nodes above it; auto_patch and "
        "scheduled_update change no node at the deploy: HyperPod patches or updates when their strategy or "
        "schedule next says; instance_types (a flexible group's InstanceRequirements) changes the types HyperPod "
        "launches next, not the nodes in service",
    ),
    "fsx_storage_capacity_gib": KeyBehaviour(IN_PLACE, "FSx can only grow (a decrease is refused)"),
    "fsx_throughput_mibps_per_tib": KeyBehaviour(IN_PLACE, ""),
    "fsx_compression": KeyBehaviour(IN_PLACE, ""),
    "slurm_config_strategy": KeyBehaviour(IN_PLACE, ""),
    "node_recovery": KeyBehaviour(IN_PLACE, ""),
    "provisioning": KeyBehaviour(
        IN_PLACE, "the template allows it, but AWS cannot switch a live cluster's mode, so predeploy refuses the switch"
    ),
    "runtime": KeyBehaviour(IN_PLACE, ""),
    "retain_outputs": KeyBehaviour(IN_PLACE, ""),
    "lanes": KeyBehaviour(
        IN_PLACE,
        "adding a lane creates it; dropping the cluster lane deletes the cluster, FSx (its data) and the network, "
        "and needs `--allow-drop-cluster-lane`",
    ),
    "observability": KeyBehaviour(
        IN_PLACE,
        "leaving prometheus deletes the metrics workspace (and its data), so predeploy refuses it without "
        "`--allow-drop-metrics`; nodes change their exporters only when provisioned again (the lifecycle runs then)",
    ),
    "teams": KeyBehaviour(
        IN_PLACE,
        "only the users file changes: a node creates groups, and the controller sets accounts, shares and QOS, "
        "when provisioned (create, scale-up, replace); a group's gid is fixed once nodes have it",
    ),
    "users": KeyBehaviour(
        IN_PLACE,
        "only the users file changes: nodes create a new user when provisioned, the others keep their uids; a "
        "removed user loses their Slurm association there, their files on FSx stay",
    ),
    "accounting_database": KeyBehaviour(
        IN_PLACE,
        "the RDS instance is created (or deleted, its data with it unless retain_outputs) and the cluster's "
        "AccountingDatabase set in place; the job history already recorded stays where it was, it is not moved",
    ),
    "accounting_database_zone_id": KeyBehaviour(
        REPLACED,
        "the database's second subnet is replaced by one in the new zone (another address range); the instance "
        "stays in the cluster's zone and keeps running",
    ),
    "alert_emails": KeyBehaviour(IN_PLACE, "e-mail subscriptions are added or removed; a new address confirms once"),
    "alert_stall_minutes": KeyBehaviour(
        IN_PLACE, "the cluster facts change with the lifecycle upload; a node reads them when it is next provisioned"
    ),
}


def fixed_names(template: Mapping[str, Any]) -> set[str]:
    """Every literal create-only name in a template (bucket, cluster, ...)."""
    names = set()
    for resource in template.get("Resources", {}).values():
        name = _fixed_name(resource["Type"], resource.get("Properties", {}))
        if name:
            names.add(f"{resource['Type']} {name}")
    return names


def refused_changes(deployed: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """One message per changed config key that cannot change on the deployed stack."""
    messages = []
    for key, behaviour in KEY_BEHAVIOUR.items():
        if key in deployed and key in wanted and deployed[key] != wanted[key] and behaviour.verdict == FORBIDDEN:
            messages.append(
                f"config key '{key}' is {deployed[key]!r} on the deployed stack and {wanted[key]!r} now: it "
                f"cannot change on a live stack ({behaviour.note}); or set it back to {deployed[key]!r}"
            )
    return messages


# The template's Metadata key holding the config it was synthesized from (read back by stacks.predeploy).
CONFIG_METADATA_KEY = "HyperPodConfig"


def config_record(config: Any) -> dict[str, Any]:
    """The config as JSON values, every key (compute groups as a list of objects)."""
    record = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, tuple):
            value = [dataclasses.asdict(item) if dataclasses.is_dataclass(item) else item for item in value]
        record[field.name] = value
    return json.loads(json.dumps(record))  # tuples inside groups become lists, as they come back


# What predeploy lets through only when told (python -m stacks.predeploy --allow-...).
@dataclass(frozen=True)
class Allowances:
    replace: tuple[str, ...] = ()  # logical ids of stateful resources that may be replaced or removed
    remove_groups: tuple[str, ...] = ()  # compute groups that may go (with their nodes)
    drop_cluster_lane: bool = False  # lanes cluster|both -> jobs: the cluster, FSx and the network go
    replace_controller: bool = False  # controller_instance_type changes: HyperPod replaces the controller node
    drop_metrics: bool = False  # observability leaves prometheus: the metrics workspace and its samples go


NOTHING_ALLOWED = Allowances()


# Resources whose replacement or removal loses data or a running cluster, and what goes with them.
FSX_ONLY_FOLDERS = tuple(
    fsx_dir(folder) for folder in FSX_FOLDER_FACTS.values() if folder not in {link.folder for link in DATA_LINKS}
)
FSX_LOSS = (
    f"everything only on FSx: {', '.join(FSX_ONLY_FOLDERS)} (base models, the compile cache, container images, "
    "scratch) and files under the linked folders not yet exported to the bucket"
)
METRICS_LOSS = (
    "the Amazon Managed Prometheus workspace and every sample in it: the nodes' CPU, memory, device, EFA and Slurm "
    "history and every run's loss, learning rate, tokens/s, MFU and step series (`hpctl metrics RUN` reads them)"
)
METRICS_WORKSPACE_TYPE = "AWS::APS::Workspace"
STATEFUL_TYPES = {
    "AWS::FSx::FileSystem": FSX_LOSS,
    "AWS::S3::Bucket": "the objects in the bucket (payloads, datasets, run outputs, or the access logs)",
    "AWS::SageMaker::Cluster": "the running cluster: every node, its local disks and the Slurm queue",
    "AWS::EC2::VPC": "the network, and with it FSx and the cluster",
    METRICS_WORKSPACE_TYPE: METRICS_LOSS,
}
STATEFUL_ACTIONS = (REPLACED, "removed")


def stateful_refusals(changes: list[ResourceChange], allow: Allowances) -> list[str]:
    """One message per forbidden change, and per stateful resource replaced or removed without leave."""
    messages = []
    for change in changes:
        if change.action == FORBIDDEN:
            messages.append(f"the deployed stack cannot take this change: {change.line()}")
        elif change.resource_type in STATEFUL_TYPES and change.action in STATEFUL_ACTIONS:
            if change.logical_id in allow.replace or (change.action == "removed" and allow.drop_cluster_lane):
                continue
            if change.resource_type == METRICS_WORKSPACE_TYPE and change.action == "removed" and allow.drop_metrics:
                continue
            messages.append(
                f"resource {change.logical_id} ({change.resource_type}) would be {change.action} "
                f"({change.why}), losing {STATEFUL_TYPES[change.resource_type]}. A code change between releases "
                f"(a logical id or a create-only property) causes this too. Keep the deployed release, or copy what "
                f"you need to S3 and pass --allow-replace {change.logical_id} (make deploy "
                f"PREDEPLOY_ARGS='--allow-replace {change.logical_id}')"
            )
    return messages


def _has_cluster_lane(record: Mapping[str, Any]) -> bool:
    return record.get("lanes", "cluster") in ("cluster", "both")


def _groups(record: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {group["name"]: group for group in record.get("compute_groups", [])}


def provisioning_of(record: Mapping[str, Any]) -> str:
    """The record's provisioning mode; a record from before the key was continuous exactly when a group was Spot."""
    if "provisioning" in record:
        return record["provisioning"]
    spot = any(group.get("capacity") == SPOT for group in record.get("compute_groups", []))
    return "continuous" if spot else "standard"


def metrics_refusals(deployed: Mapping[str, Any], wanted: Mapping[str, Any], allow: Allowances) -> list[str]:
    """Leaving observability = prometheus deletes the stack's metrics workspace (a stack from before the key: none)."""
    old_mode, new_mode = deployed.get("observability"), wanted.get("observability")
    if old_mode != PROMETHEUS_MODE or new_mode in (None, PROMETHEUS_MODE) or allow.drop_metrics:
        return []
    return [
        f"config key 'observability' is {old_mode!r} on the deployed stack and {new_mode!r} now: the deploy deletes "
        f"{METRICS_LOSS}; AWS's extension (managed) starts a new workspace with none of it. Read what you need first "
        "(the dashboard, or the workspace's query API), then pass --allow-drop-metrics (make deploy "
        f"PREDEPLOY_ARGS=--allow-drop-metrics), or set it back to {old_mode!r}"
    ]


def value_refusals(deployed: Mapping[str, Any], wanted: Mapping[str, Any], allow: Allowances) -> list[str]:
    """Changes the template allows but AWS refuses, or that lose data, from the recorded and the new config."""
    if not _has_cluster_lane(deployed):
        return []  # jobs-only: no cluster, no FSx; compute_groups only chose the images
    if not _has_cluster_lane(wanted):
        if allow.drop_cluster_lane:
            return []
        return [
            f"config key 'lanes' is {deployed.get('lanes')!r} on the deployed stack and {wanted.get('lanes')!r} now: "
            f"that deletes the HyperPod cluster, the network and the FSx file system with {FSX_LOSS}. The bucket "
            "and its outputs/ stay. Copy what you need to S3 first (e.g. `aws s3 sync` from a node), then pass "
            "--allow-drop-cluster-lane (make deploy PREDEPLOY_ARGS=--allow-drop-cluster-lane), or set lanes back"
        ]
    messages: list[str] = metrics_refusals(deployed, wanted, allow)
    old_capacity, new_capacity = deployed.get("fsx_storage_capacity_gib"), wanted.get("fsx_storage_capacity_gib")
    if isinstance(old_capacity, int) and isinstance(new_capacity, int) and new_capacity < old_capacity:
        messages.append(
            f"config key 'fsx_storage_capacity_gib' is {old_capacity} on the deployed stack and {new_capacity} now: "
            "FSx for Lustre storage can only grow (UpdateFileSystem takes a larger multiple of 2400 GiB for "
            f"PERSISTENT_2 SSD), so the update would fail and roll back; set it back to {old_capacity} or larger"
        )
    old_type, new_type = deployed.get("controller_instance_type"), wanted.get("controller_instance_type")
    if old_type and new_type and old_type != new_type and not allow.replace_controller:
        messages.append(
            f"config key 'controller_instance_type' is {old_type!r} on the deployed stack and {new_type!r} now: "
            "HyperPod replaces the controller node for a new type, and with it the Slurm controller's state on "
            "its disks (the queue, running and pending jobs, the accounting database); drain the queue first, "
            "then pass --allow-controller-replace (make deploy PREDEPLOY_ARGS=--allow-controller-replace), or "
            f"set it back to {old_type!r}"
        )
    old_groups, new_groups = _groups(deployed), _groups(wanted)
    capacity_changed = False
    for name, group in old_groups.items():
        if name not in new_groups and name not in allow.remove_groups:
            messages.append(
                f"config key 'compute_groups': group {name!r} (partition {group.get('partition')!r}, "
                f"{group.get('count')} x {group.get('instance_type')}) is gone from the config: the deploy deletes "
                "its nodes with their local disks (the /opt/sagemaker volume) and its Slurm partition with the jobs "
                "queued there; FSx and the bucket stay. A renamed group is a removed one plus a new one. If that is "
                f"intended, pass --allow-remove-group {name} (make deploy PREDEPLOY_ARGS='--allow-remove-group {name}')"
            )
        elif name in new_groups and new_groups[name].get("capacity") != group.get("capacity"):
            capacity_changed = True
            messages.append(
                f"config key 'compute_groups' group {name!r}, key 'capacity' is {group.get('capacity')!r} on the "
                f"deployed stack and {new_groups[name].get('capacity')!r} now: a HyperPod instance group's capacity "
                "type is fixed when it is created; add a new group with the other capacity (and set this one's "
                f"count to 0), or set it back to {group.get('capacity')!r}"
            )
    old_mode, new_mode = provisioning_of(deployed), provisioning_of(wanted)
    if old_mode != new_mode and not capacity_changed:
        strategy = deployed.get("slurm_config_strategy")
        keep = f"set provisioning back to {old_mode!r}" + (
            f" (and slurm_config_strategy to {strategy!r}, as deployed)" if old_mode == "standard" and strategy else ""
        )
        messages.append(
            f"config key 'provisioning' is {old_mode!r} on the deployed stack and {new_mode!r} now: HyperPod fixes a "
            "cluster's NodeProvisioningMode when it is created and cannot switch a live one; "
            f"{keep}, or deploy a new cluster in that mode (`make destroy`, then deploy)"
        )
    return messages
