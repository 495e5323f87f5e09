"""The deployment a command works on: the project's settings, an AWS session, and the stack's cluster and nodes."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3

from cluster_contract import StackOutput
from hpctl.common import ssm
from hpctl.common.cluster import ClusterState, choose_node, describe_cluster, list_nodes, require_usable, ssm_target
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.project import ProjectSettings, resolve_settings
from hpctl.common.stack import StackInfo, describe_stack, require_outputs


@dataclass(frozen=True)
class Deployment:
    settings: ProjectSettings
    session: boto3.Session
    profile: str | None

    @property
    def region(self) -> str:
        return self.session.region_name

    def stack(self) -> StackInfo:
        return require_outputs(describe_stack(self.session, self.settings.stack_name))


def connect(args: argparse.Namespace) -> Deployment:
    settings = resolve_settings(stack=args.stack, region=args.region, cwd=Path.cwd())
    with aws_errors("start an AWS session"):
        session = boto3.Session(profile_name=args.profile, region_name=settings.region)
    if not session.region_name:
        raise HpctlError("no AWS region: pass --region, set `region` in cdk.json context, or set AWS_REGION")
    return Deployment(settings=settings, session=session, profile=args.profile)


def deployed_cluster(deployment: Deployment) -> tuple[ClusterState, str]:
    stack = deployment.stack()
    return describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME)), stack.output(
        StackOutput.CONTROLLER_GROUP
    )


def session_request(
    deployment: Deployment, *, group: str | None, node: str | None, ready: bool, command: str | None = None
) -> ssm.SessionRequest:
    """The SSM session for a node of the deployed cluster (the controller unless told otherwise)."""
    stack = deployment.stack()
    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    require_usable(cluster, ready=ready)
    nodes = list_nodes(deployment.session, cluster.name)
    chosen = choose_node(
        nodes, cluster=cluster.name, group=group or stack.output(StackOutput.CONTROLLER_GROUP), instance_id=node
    )
    print(f"session on {chosen.group}/{chosen.instance_id} ({chosen.status})", file=sys.stderr, flush=True)
    return ssm.SessionRequest(
        target=ssm_target(cluster, chosen), region=deployment.region, profile=deployment.profile, command=command
    )


def controller_request(deployment: Deployment, cluster: ClusterState, controller_group: str) -> ssm.SessionRequest:
    node = choose_node(
        list_nodes(deployment.session, cluster.name), cluster=cluster.name, group=controller_group, instance_id=None
    )
    return ssm.SessionRequest(target=ssm_target(cluster, node), region=deployment.region, profile=deployment.profile)
