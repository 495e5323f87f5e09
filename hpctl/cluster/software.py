"""`hpctl update-software`: move instance groups to HyperPod's newest AMI release (UpdateClusterSoftware), rolling
one node at a time, refused while a run is on a group unless told."""

from __future__ import annotations

import argparse

from hpctl.common.cluster import ClusterState, InstanceGroup
from hpctl.common.deployment import connect, deployed_cluster
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.prompt import confirm
from hpctl.common.registry import RoomCommands
from hpctl.common.slurm_activity import SlurmActivity, slurm_activity
from stacks.ami_updates import ROLLING_DEPLOYMENT

SHOWN_JOBS = 5


def add_parsers(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    update = sub.add_parser(
        "update-software",
        parents=[common],
        help="move groups to the newest HyperPod AMI release, one node at a time (asks first)",
    )
    update.add_argument("--group", help="only this instance group (default: every group, the controller too)")
    update.add_argument("--force", action="store_true", help="update although jobs are queued or run on the group")
    update.add_argument(
        "--rollback-alarm",
        dest="alarms",
        action="append",
        default=[],
        metavar="NAME",
        help="a CloudWatch alarm that rolls the update back when it fires, repeatable (AutoRollbackConfiguration)",
    )
    update.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal)")
    update.set_defaults(handler=update_software)


def chosen_groups(cluster: ClusterState, name: str | None) -> tuple[InstanceGroup, ...]:
    if name is None:
        return cluster.groups
    for group in cluster.groups:
        if group.name == name:
            return (group,)
    known = ", ".join(group.name for group in cluster.groups)
    raise HpctlError(f"cluster {cluster.name} has no instance group {name} (groups: {known})")


def runs_in_the_way(groups: tuple[InstanceGroup, ...], activity: SlurmActivity) -> list[str]:
    """One line per group with jobs queued or running on its partitions; a group without partitions (the
    controller, login) has every job in the way: Slurm's controller restarts with it."""
    lines = []
    for group in groups:
        jobs = activity.jobs_on(group.partitions) if group.partitions else activity.jobs
        if jobs:
            shown = ", ".join(f"{job.job} ({job.state.lower()})" for job in jobs[:SHOWN_JOBS])
            more = f" and {len(jobs) - SHOWN_JOBS} more" if len(jobs) > SHOWN_JOBS else ""
            lines.append(f"group {group.name} has jobs {shown}{more}")
    return lines


def release_line(group: InstanceGroup) -> str:
    now = group.image_release or "unknown release"
    return f"{group.name} ({now}{', ' + group.image_status if group.image_status else ''})"


def update_request(cluster: str, group: str | None, alarms: list[str]) -> dict:
    deployment = dict(ROLLING_DEPLOYMENT)
    if alarms:
        deployment["AutoRollbackConfiguration"] = [{"AlarmName": alarm} for alarm in alarms]
    request: dict = {"ClusterName": cluster, "DeploymentConfig": deployment}
    if group:
        request["InstanceGroups"] = [{"InstanceGroupName": group}]
    return request


def update_software(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster, controller_group = deployed_cluster(deployment)
    groups = chosen_groups(cluster, args.group)
    in_the_way = runs_in_the_way(groups, slurm_activity(deployment, cluster, controller_group))
    if in_the_way and not args.force:
        raise HpctlError(
            f"{'; '.join(in_the_way)}: an AMI update reboots each node, so wait until they end (`squeue`), "
            "or pass --force to update anyway (a job on a node being updated fails)"
        )
    confirm(
        f"update {', '.join(release_line(g) for g in groups)} of cluster {cluster.name} to the newest AMI release, "
        "one node at a time (each reboots)?",
        yes=args.yes,
    )
    with aws_errors(f"update the software of cluster {cluster.name}"):
        deployment.session.client("sagemaker").update_cluster_software(
            **update_request(cluster.name, args.group, args.alarms)
        )
    print(
        f"cluster {cluster.name}: software update started for {', '.join(g.name for g in groups)}; "
        "`.venv/bin/hpctl status` shows each group's AMI release (current -> desired) meanwhile"
    )
