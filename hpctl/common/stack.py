"""The deployed stack: its CloudFormation outputs (the contract every hpctl command starts from)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import boto3
from botocore.exceptions import ClientError

from cluster_contract import JobStackOutput, StackOutput
from hpctl.common.errors import HpctlError, aws_errors

# hpctl cannot work without these; the others are shown when present.
REQUIRED_KEYS = (StackOutput.CLUSTER_NAME, StackOutput.BUCKET_NAME, StackOutput.CONTROLLER_GROUP)
FAILED_STATES = ("CREATE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "ROLLBACK_IN_PROGRESS", "DELETE_FAILED")
CLUSTER_RESOURCE_TYPE = "AWS::SageMaker::Cluster"


def deploy_failed(status: str) -> bool:
    """A stack status that ends or undoes a failed deploy: every *_FAILED and every rollback
    (ROLLBACK_*, UPDATE_ROLLBACK_* with its cleanup, IMPORT_ROLLBACK_*). After a failed update the
    stack sits in UPDATE_ROLLBACK_COMPLETE with the old cluster still in service: not a success."""
    return status.endswith("_FAILED") or "ROLLBACK" in status


STACK_RESOURCE_TYPE = "AWS::CloudFormation::Stack"
# What a failed create suggests: keep what was created, to read its logs and look at it.
NO_ROLLBACK_HINT = (
    "to keep a failed create's resources for debugging, deploy with `make deploy DEPLOY_ARGS=--no-rollback`"
)


@dataclass(frozen=True)
class StackInfo:
    name: str
    region: str
    status: str
    reason: str
    outputs: dict[str, str]

    @property
    def in_progress(self) -> bool:
        return self.status.endswith("_IN_PROGRESS")

    def output(self, key: str) -> str:
        return self.outputs.get(key, "")


class StackNotFound(HpctlError):
    """No stack of that name in the region (not deployed yet, or another region)."""


def describe_stack(session: boto3.Session, stack_name: str) -> StackInfo:
    """The stack's status and outputs; StackNotFound when it is not deployed in this region."""
    cloudformation = session.client("cloudformation")
    region = session.region_name
    with aws_errors(f"read stack {stack_name}"):
        try:
            stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        except ClientError as error:
            if "does not exist" not in error.response.get("Error", {}).get("Message", ""):
                raise
            stacks = []
    if not stacks:
        raise StackNotFound(
            f"stack {stack_name} not found in region {region}: deploy it (`make deploy`), "
            "or pass the region it lives in (--region) and its name (--stack)"
        )
    stack = stacks[0]
    return StackInfo(
        name=stack_name,
        region=region,
        status=stack["StackStatus"],
        reason=stack.get("StackStatusReason", ""),
        outputs={item["OutputKey"]: item["OutputValue"] for item in stack.get("Outputs", [])},
    )


def require_outputs(stack: StackInfo) -> StackInfo:
    """Stop early when the stack cannot serve hpctl yet (still creating, failed, outputs missing)."""
    missing = [key for key in REQUIRED_KEYS if not stack.output(key)]
    if stack.status in FAILED_STATES:
        reason = f" ({stack.reason})" if stack.reason else ""
        raise HpctlError(
            f"stack {stack.name} is {stack.status}{reason}: its deploy failed; "
            "see the CloudFormation events (`hpctl wait` prints the first failure) and the nodes' logs "
            "(`hpctl logs lifecycle`), fix the cause and deploy again"
        )
    if missing and stack.in_progress:
        raise HpctlError(
            f"stack {stack.name} is {stack.status} and has no outputs yet: "
            "`hpctl wait` follows the deploy until the cluster is in service"
        )
    if missing and stack.output(JobStackOutput.JOB_ROLE_ARN):
        raise HpctlError(
            f"stack {stack.name} is a jobs-only deploy (cdk.json lanes = jobs): it has no cluster; use "
            "`hpctl job submit|status|logs|stop`, or deploy with lanes = both for a cluster too"
        )
    if missing:
        raise HpctlError(
            f"stack {stack.name} ({stack.status}) lacks the outputs {', '.join(missing)}: "
            "is it this project's stack? deploy the current version with `make deploy`"
        )
    return stack


def _stack_missing(error: ClientError) -> bool:
    return "does not exist" in error.response.get("Error", {}).get("Message", "")


def template_cluster_name(session: boto3.Session, stack_name: str) -> str:
    """The cluster name written in the stack's template: still readable after a failed create rolled
    back (the cluster and the outputs are gone, the template stays until the stack is deleted)."""
    cloudformation = session.client("cloudformation")
    with aws_errors(f"read the template of stack {stack_name}"):
        try:
            body = cloudformation.get_template(StackName=stack_name, TemplateStage="Original")["TemplateBody"]
        except ClientError as error:
            if not _stack_missing(error):
                raise
            raise StackNotFound(f"stack {stack_name} not found in region {session.region_name}") from error
    if isinstance(body, str):  # boto3 parses a JSON template; a YAML one would stay text
        raise HpctlError(f"stack {stack_name}'s template is not JSON: is it this project's stack?")
    for resource in body.get("Resources", {}).values():
        if resource.get("Type") == CLUSTER_RESOURCE_TYPE:
            name = resource.get("Properties", {}).get("ClusterName")
            if isinstance(name, str) and name:
                return name
    raise HpctlError(f"stack {stack_name}'s template has no {CLUSTER_RESOURCE_TYPE} with a literal ClusterName")


@dataclass(frozen=True)
class StackEvent:
    event_id: str
    time: datetime
    logical_id: str
    resource_type: str
    status: str
    reason: str

    @property
    def failed(self) -> bool:
        return self.status.endswith("_FAILED")

    def starts_operation(self, stack_name: str) -> bool:
        """The stack's own first event of a create, update or delete."""
        return (
            self.resource_type == STACK_RESOURCE_TYPE
            and self.logical_id == stack_name
            and self.status in ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS", "DELETE_IN_PROGRESS")
        )

    def line(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        return f"  {self.time:%H:%M:%S} {self.status} {self.resource_type} {self.logical_id}{reason}"


def newest_events(session: boto3.Session, stack_name: str) -> Iterator[StackEvent]:
    """The stack's events, newest first, one page at a time (callers stop early)."""
    paginator = session.client("cloudformation").get_paginator("describe_stack_events")
    with aws_errors(f"read the events of stack {stack_name}"):
        for page in paginator.paginate(StackName=stack_name):
            for event in page["StackEvents"]:
                yield StackEvent(
                    event_id=event["EventId"],
                    time=event["Timestamp"],
                    logical_id=event.get("LogicalResourceId", ""),
                    resource_type=event.get("ResourceType", ""),
                    status=event.get("ResourceStatus", ""),
                    reason=event.get("ResourceStatusReason", ""),
                )


class EventFeed:
    """The events of the stack's current operation, each handed out once, oldest first."""

    def __init__(self, stack_name: str) -> None:
        self.stack_name = stack_name
        self.seen: set[str] = set()
        self.history: list[StackEvent] = []

    def new_events(self, session: boto3.Session) -> list[StackEvent]:
        fresh: list[StackEvent] = []
        for event in newest_events(session, self.stack_name):
            if event.event_id in self.seen:
                break
            fresh.append(event)
            if event.starts_operation(self.stack_name):
                break
        fresh.reverse()
        self.seen.update(event.event_id for event in fresh)
        self.history += fresh
        return fresh

    def first_failure(self) -> StackEvent | None:
        """The root cause: the first failed event (later ones are mostly "Resource creation cancelled")."""
        return next((event for event in self.history if event.failed and event.reason), None)
