"""The deployed stack: its CloudFormation outputs (the contract every hpctl command starts from)."""

from __future__ import annotations

from dataclasses import dataclass

import boto3
from botocore.exceptions import ClientError

from hpctl.errors import HpctlError, aws_errors

# Logical ids of the stack's CfnOutputs (fixed by the project's contract).
OUTPUT_KEYS = (
    "ClusterName",
    "ClusterArn",
    "ClusterId",
    "BucketName",
    "FsxFileSystemId",
    "FsxDnsName",
    "FsxMountName",
    "ImageUri",
    "Region",
    "ControllerGroup",
    "ComputeGroup",
    "ShellCommand",
    "SubmitCommand",
)
# hpctl cannot work without these; the others are shown when present.
REQUIRED_KEYS = ("ClusterName", "BucketName", "ControllerGroup")
FAILED_STATES = ("CREATE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "ROLLBACK_IN_PROGRESS", "DELETE_FAILED")


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
            "see the CloudFormation events, fix the cause and deploy again"
        )
    if missing and stack.in_progress:
        raise HpctlError(
            f"stack {stack.name} is {stack.status} and has no outputs yet: "
            "`hpctl wait` follows the deploy until the cluster is in service"
        )
    if missing:
        raise HpctlError(
            f"stack {stack.name} ({stack.status}) lacks the outputs {', '.join(missing)}: "
            "is it this project's stack? deploy the current version with `make deploy`"
        )
    return stack
