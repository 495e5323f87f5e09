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


def template_json(template: Mapping[str, Any]) -> str:
    return json.dumps(template, sort_keys=True)


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
    "controller_instance_type": KeyBehaviour(IN_PLACE, ""),
    "controller_instance_count": KeyBehaviour(FIXED, "only 1 is allowed"),
    "login_instance_type": KeyBehaviour(IN_PLACE, ""),
    "login_instance_count": KeyBehaviour(IN_PLACE, ""),
    "compute_groups": KeyBehaviour(IN_PLACE, "every group key, and adding a group"),
    "fsx_storage_capacity_gib": KeyBehaviour(IN_PLACE, "FSx can only grow"),
    "fsx_throughput_mibps_per_tib": KeyBehaviour(IN_PLACE, ""),
    "fsx_compression": KeyBehaviour(IN_PLACE, ""),
    "slurm_config_strategy": KeyBehaviour(IN_PLACE, ""),
    "node_recovery": KeyBehaviour(IN_PLACE, ""),
    "runtime": KeyBehaviour(IN_PLACE, ""),
    "retain_outputs": KeyBehaviour(IN_PLACE, ""),
    "lanes": KeyBehaviour(
        IN_PLACE,
        "adding a lane creates it; dropping the cluster lane deletes the cluster, FSx (its data) and the network",
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
