"""Log groups for CDK's own custom-resource handlers: kept a month, deleted with the stack, encrypted
with the stack's log key (stacks/log_encryption.py).

CDK's singleton providers (the VPC default-security-group restriction, the S3 auto-delete) are
bare Lambda functions with no log group of their own: Lambda would create /aws/lambda/<name> on
their first run, with no expiry, and destroy would leave it behind. Pointing each function's
LoggingConfig at a stack-owned group also orders destroy: the function goes before its group.
"""

from __future__ import annotations

from aws_cdk import CfnResource, Stack
from aws_cdk import aws_logs as logs

from stacks.log_encryption import encrypted_log_group

PROVIDER_PREFIX = "Custom::"
PROVIDER_SUFFIX = "CustomResourceProvider"
HANDLER_ID = "Handler"


def attach_provider_log_groups(stack: Stack) -> list[logs.LogGroup]:
    """Give every CDK custom-resource provider's handler in ``stack`` its own log group (call last)."""
    groups = []
    for child in list(stack.node.children):
        name = child.node.id
        if not (name.startswith(PROVIDER_PREFIX) and name.endswith(PROVIDER_SUFFIX)):
            continue
        handler = child.node.try_find_child(HANDLER_ID)
        if not isinstance(handler, CfnResource) or handler.cfn_resource_type != "AWS::Lambda::Function":
            continue
        short_name = name.removeprefix(PROVIDER_PREFIX).removesuffix(PROVIDER_SUFFIX)
        group = encrypted_log_group(stack, f"{short_name}HandlerLogs")
        handler.add_property_override("LoggingConfig", {"LogGroup": group.log_group_name})
        groups.append(group)
    return groups
