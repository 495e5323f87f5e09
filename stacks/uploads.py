"""What every upload into the data bucket shares: one prefix per deployment, pruned, cleaned on destroy."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

from stacks.log_encryption import encrypted_log_group

# Never uploaded: interpreter and tool caches, build metadata, editor droppings.
CACHE_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.egg-info", ".DS_Store"]


def deploy_to_prefix(
    scope: Construct,
    construct_id: str,
    *,
    bucket: s3.IBucket,
    prefix: str,
    sources: list[s3_deployment.ISource],
    keep: tuple[str, ...] = (),
) -> s3_deployment.BucketDeployment:
    """Sync ``sources`` to ``s3://bucket/prefix/``: stale files under the prefix are pruned (except those
    matching a ``keep`` pattern), nothing outside it is touched, and destroying the stack removes what was
    uploaded."""
    return s3_deployment.BucketDeployment(
        scope,
        construct_id,
        sources=sources,
        destination_bucket=bucket,
        destination_key_prefix=f"{prefix}/",
        prune=True,
        exclude=list(keep) or None,
        retain_on_delete=False,
        output_object_keys=False,  # keeps the custom resource's response small for large payload trees
        memory_limit=512,
        log_group=handler_log_group(scope),
    )


def handler_log_group(scope: Construct) -> logs.ILogGroup:
    """One log group for the stack's single BucketDeployment handler (CDK keys the handler by memory size,
    so every upload shares it); removed on destroy, where CDK's default log group would be retained."""
    stack = Stack.of(scope)
    existing = stack.node.try_find_child(UPLOAD_LOGS_ID)
    if existing is not None:
        return existing
    return encrypted_log_group(stack, UPLOAD_LOGS_ID)


UPLOAD_LOGS_ID = "UploadHandlerLogs"
