"""Where `hpctl submit --dry-run` says the chain runs: the partition the deploy of cdk.json would give the run.

The deployed cluster writes each compute group's partition facts (stacks/config.py partition_facts); offline,
the same facts come from cdk.json's compute_groups and stacks/accelerators.py, and submit's own rule picks the
partition (llm_pipeline.jobs.partitions.choose_partition). A run whose accelerator no group has is named in a
warning before the chain: on the cluster it would be refused (neuron) or run on another accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import partitions
from llm_pipeline.jobs.run_facts import RunFacts
from stacks.accelerators import INSTANCE_TYPES


@dataclass(frozen=True)
class PartitionPlan:
    env: dict[str, str] = field(default_factory=dict)  # HPL_PARTITION and its facts, as the deploy gives jobs
    lines: list[str] = field(default_factory=list)  # what to print before the chain
    warning: str = ""


def planned_groups(context: dict) -> dict[str, dict[str, object]]:
    """{partition: facts} of cdk.json's compute groups, in the deploy's shape (the first group's is the
    cluster's default); a group of an unknown type is left out (cdk synth refuses it)."""
    found: dict[str, dict[str, object]] = {}
    for group in context.get("compute_groups") or []:
        if not isinstance(group, dict) or group.get("instance_type") not in INSTANCE_TYPES:
            continue
        facts = INSTANCE_TYPES[group["instance_type"]]
        found.setdefault(
            str(group.get("partition") or group.get("name")),
            {
                "group": group.get("name", ""),
                "instance_type": group["instance_type"],
                "count": group.get("count", 1),
                "accelerator": facts.accelerator,
                "devices_per_node": facts.devices,
                "efa_interfaces": facts.efa_interfaces,
                "efa_device_rdma": int(facts.efa_device_rdma),
                "fp8": int(facts.supports_fp8),
                "image_family": facts.image_family,
                "peak_tflops": facts.peak_tflops_per_device,
            },
        )
    return found


def partition_plan(context: dict, facts: RunFacts) -> PartitionPlan:
    """The partition this run would get on a cluster deployed from ``context`` (cdk.json's), with a warning
    when no compute group has the accelerator its train.backend needs."""
    groups = planned_groups(context)
    if not groups:
        return PartitionPlan(lines=["# cdk.json names no compute group: the partition is the cluster's default"])
    accelerator = partitions.ACCELERATOR_OF_BACKEND.get(facts.backend, "")
    names = ", ".join(f"{name} ({group['instance_type']}, {group['accelerator']})" for name, group in groups.items())
    warning = ""
    if accelerator and not facts.partition and all(g["accelerator"] != accelerator for g in groups.values()):
        warning = (
            f"warning: cdk.json has no compute group with {accelerator} instances, which train.backend = "
            f"'{facts.backend}' needs (its groups: {names}): add one to compute_groups and deploy"
        )
    try:
        name = partitions.choose_partition(
            groups,
            requested=facts.partition,
            accelerator=accelerator,
            required=accelerator in partitions.REQUIRED,
            default=next(iter(groups)),
        )
    except StepError as exc:
        return PartitionPlan(lines=[f"# {exc}"], warning=warning)
    group = groups[name]
    if warning:  # where the run would really land: the cluster's default partition, on the wrong accelerator
        warning += f"; as it stands every step lands on partition {name} ({group['accelerator']}), as drawn below"
    line = (
        f"# partition {name}: compute group {group['group']}, {group['count']} x {group['instance_type']} "
        f"({group['devices_per_node']} {group['accelerator']} devices per node), from cdk.json"
    )
    return PartitionPlan(env=partitions.partition_environment(name, group), lines=[line], warning=warning)
