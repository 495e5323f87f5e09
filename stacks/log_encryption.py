"""Log groups the stack owns (VPC flow logs, CDK's handler logs), encrypted with one key of the stack's own.

CloudWatch Logs encrypts with a customer-managed key only when the key policy lets the regional logs
service use it, for log groups of this account and region (the encryption context names the group).
The key is destroyed with the stack after a 7-day wait; every group references it, so CloudFormation
deletes the groups first.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

LOGS_KEY_ID = "LogsKey"
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
LOGS_SERVICE_ACTIONS = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]


def logs_key(scope: Construct) -> kms.IKey:
    """The stack's one log-group key, created on first use."""
    stack = Stack.of(scope)
    existing = stack.node.try_find_child(LOGS_KEY_ID)
    if existing is not None:
        return existing
    key = kms.Key(
        stack,
        LOGS_KEY_ID,
        description=f"Encrypts the CloudWatch log groups of {stack.stack_name}",
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=Duration.days(7),
    )
    groups_here = stack.format_arn(
        service="logs", resource="log-group", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="CloudWatchLogsOfThisStackRegion",
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            actions=LOGS_SERVICE_ACTIONS,
            resources=["*"],  # in a key policy, "*" is this key
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": groups_here}},
        )
    )
    return key


def encrypted_log_group(scope: Construct, construct_id: str, name: str | None = None) -> logs.LogGroup:
    """A log group kept a month, deleted with the stack, encrypted with the stack's log key. ``name``: the
    one a service writes to on its own (made here first, so that destroy deletes it too)."""
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=name,
        retention=LOG_RETENTION,
        removal_policy=RemovalPolicy.DESTROY,
        encryption_key=logs_key(scope),
    )
