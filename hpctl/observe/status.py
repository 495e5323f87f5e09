"""`hpctl status`: stack, cluster, instance groups (capacity type, training plan), nodes, FSx and image in one view."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass

import boto3
from botocore.exceptions import ClientError

from cluster_contract import StackOutput
from hpctl.common import run_progress
from hpctl.common.cluster import describe_cluster, list_nodes
from hpctl.common.errors import aws_errors
from hpctl.common.stack import StackInfo
from hpctl.common.table import format_table
from hpctl.observe import observability


def describe_fsx(session: boto3.Session, file_system_id: str) -> dict:
    """Lifecycle and size of the cluster's file system; ``status`` says "not found" when it is gone."""
    found = {"id": file_system_id, "status": "not found"}
    if not file_system_id:
        return found
    with aws_errors(f"describe file system {file_system_id}"):
        try:
            systems = session.client("fsx").describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "FileSystemNotFound":
                raise
            systems = []
    for system in systems:
        lustre = system.get("LustreConfiguration", {})
        found.update(
            status=system.get("Lifecycle") or "unknown",
            storage_gib=system.get("StorageCapacity"),
            dns_name=system.get("DNSName", ""),
            mount_name=lustre.get("MountName", ""),
        )
    return found


def collect_status(session: boto3.Session, stack: StackInfo) -> dict:
    cluster = describe_cluster(session, stack.output(StackOutput.CLUSTER_NAME))
    order = {group.name: index for index, group in enumerate(cluster.groups)}
    nodes = sorted(list_nodes(session, cluster.name), key=lambda node: order.get(node.group, len(order)))
    fsx = describe_fsx(session, stack.output(StackOutput.FSX_FILE_SYSTEM_ID))
    fsx.setdefault("dns_name", stack.output(StackOutput.FSX_DNS_NAME))
    fsx["mount_name"] = fsx.get("mount_name") or stack.output(StackOutput.FSX_MOUNT_NAME)
    return {
        "stack": {"name": stack.name, "region": stack.region, "status": stack.status, "outputs": stack.outputs},
        "cluster": {
            "name": cluster.name,
            "arn": cluster.arn,
            "id": cluster.cluster_id,
            "status": cluster.status,
            "failure_message": cluster.failure_message,
            "instance_groups": [{**asdict(group), "training_plan": group.training_plan} for group in cluster.groups],
        },
        "nodes": [asdict(node) for node in nodes],
        "fsx": fsx,
        "image_uri": stack.output(StackOutput.IMAGE_URI),
    }


def _plain(value):
    """A dataclass of the run's files (progress, estimate) as its fields; anything else as text."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def render_json(status: dict) -> str:
    return json.dumps(status, indent=2, default=_plain)


def render_text(status: dict) -> str:
    stack, cluster, fsx = status["stack"], status["cluster"], status["fsx"]
    cluster_line = f"{cluster['name']}  {cluster['status']}  (id {cluster['id']})"
    if cluster["status"] == "Failed":
        cluster_line += f"\n             reason: {cluster['failure_message'] or 'none given'}"
    size = f", {fsx['storage_gib']} GiB" if fsx.get("storage_gib") else ""
    lines = [
        f"Stack        {stack['name']}  {stack['status']}  ({stack['region']})",
        f"Cluster      {cluster_line}",
        f"FSx          {fsx['id']}  {fsx['status']}{size}  {fsx.get('dns_name', '')}@tcp:/{fsx.get('mount_name', '')}",
        f"Image        {status['image_uri'] or '-'}",
        f"Bucket       {stack['outputs'].get('BucketName', '-')}",
        *([f"Metrics      {observability.render_health(watched)}"] if (watched := status.get("observability")) else []),
        *(slurm_lines(status["slurm"]) if status.get("slurm") else []),
        "",
        "Instance groups",
        format_table(
            ["GROUP", "TYPE", "NODES (current/target)", "CAPACITY", "TRAINING PLAN", "AMI RELEASE"],
            [
                [
                    g["name"],
                    g["instance_type"],
                    f"{g['current']}/{g['target']}",
                    g["capacity"],
                    g["training_plan"],
                    ami_release(g),
                ]
                for g in cluster["instance_groups"]
            ],
        ),
        "",
        "Nodes",
    ]
    if status["nodes"]:
        lines.append(
            format_table(
                ["GROUP", "INSTANCE", "TYPE", "STATUS", "LAUNCHED", "MESSAGE"],
                [
                    [
                        n["group"],
                        n["instance_id"],
                        n["instance_type"],
                        n["status"],
                        _when(n["launch_time"]),
                        "" if n["status"] == "Running" else n["message"],
                    ]
                    for n in status["nodes"]
                ],
            )
        )
    else:
        lines.append("  none yet")
    if status.get("run"):
        lines += ["", *run_progress.render(status["run"], status["run"].get("cost"))]
    return "\n".join(lines)


def slurm_lines(slurm: dict) -> list[str]:
    lines = [f"Slurm        {slurm['version']}, {slurm['running']} job(s) running, {slurm['queued']} other(s) queued"]
    for group, hours in slurm["saved"].items():
        held, always_on = hours["held_node_hours"], hours["always_on_node_hours"]
        lines.append(
            f"Saved        {group}: {always_on - held:.1f} node-hours ({held:.1f} held of {always_on:.1f} always-on, "
            "since its first claim; scale_with_runs)"
        )
    for group, failed in slurm.get("capacity_failures", {}).items():
        lines += [f"Capacity     {group}: {line}" for line in failed]
    for served in slurm.get("serving", []):  # hpctl serve
        lines.append(
            f"Serving      {served['run']}: job {served['job']} {served['state']} on {served['partition']}, "
            f"{served['cost']}"
        )
    return lines


def ami_release(group: dict) -> str:
    """The group's HyperPod AMI release, "-> desired" while an update rolls out, and its status when not current."""
    text = group["image_release"] or "-"
    if group["desired_image_release"] and group["desired_image_release"] != group["image_release"]:
        text += f" -> {group['desired_image_release']}"
    if group["image_status"] and group["image_status"] != "UpToDate":
        text += f" ({group['image_status']})"
    return text


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "-"
