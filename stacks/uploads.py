"""What every upload into the data bucket shares: one prefix per deployment, pruned, cleaned on destroy."""

from __future__ import annotations

from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

# Never uploaded: interpreter and tool caches, build metadata, editor droppings.
CACHE_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.egg-info", ".DS_Store"]


def deploy_to_prefix(
    scope: Construct,
    construct_id: str,
    *,
    bucket: s3.IBucket,
    prefix: str,
    sources: list[s3_deployment.ISource],
) -> s3_deployment.BucketDeployment:
    """Sync ``sources`` to ``s3://bucket/prefix/``: stale files under the prefix are pruned, nothing
    outside it is touched, and destroying the stack removes what was uploaded."""
    return s3_deployment.BucketDeployment(
        scope,
        construct_id,
        sources=sources,
        destination_bucket=bucket,
        destination_key_prefix=f"{prefix}/",
        prune=True,
        retain_on_delete=False,
        output_object_keys=False,  # keeps the custom resource's response small for large payload trees
        memory_limit=512,
    )
