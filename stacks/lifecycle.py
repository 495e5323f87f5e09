"""Lifecycle: the OnInitComplete script and the generated cluster facts, uploaded before the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

from cluster_contract import CLUSTER_FACTS_FILE, LIFECYCLE_PREFIX
from lifecycle.slurm_teams import USERS_FILE
from stacks.config import LEGACY_PROVISIONING_FILE, LIFECYCLE_SCRIPT
from stacks.uploads import CACHE_EXCLUDES, deploy_to_prefix
from stacks.validation import StackError


class LifecycleLayoutError(StackError):
    """The lifecycle/ folder cannot work with an API-configured Slurm cluster."""


def check_lifecycle_dir(source_dir: Path) -> None:
    """Fail at synth, not 20 minutes into CreateCluster."""
    if not (source_dir / LIFECYCLE_SCRIPT).is_file():
        raise LifecycleLayoutError(
            f"{source_dir / LIFECYCLE_SCRIPT} is missing: HyperPod runs it on every node "
            "(OnInitComplete); restore it or fix LIFECYCLE_SCRIPT in stacks/config.py"
        )
    for name, why in (
        (LEGACY_PROVISIONING_FILE, "HyperPod rejects it next to an API Slurm configuration"),
        (CLUSTER_FACTS_FILE, "the stack generates it; a checked-in copy would be overwritten"),
        (USERS_FILE, "the stack generates it from cdk.json users and teams; a checked-in copy would be overwritten"),
    ):
        found = sorted(source_dir.rglob(name))
        if found:
            raise LifecycleLayoutError(f"{found[0]} must not exist: {why}; delete it")


class LifecycleUpload(Construct):
    """s3://<bucket>/lifecycle/: the lifecycle/ folder plus cluster-facts.json (see stacks.config.cluster_facts)
    and cluster-users.json (stacks.teams.users_file: the users and teams every node creates)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source_dir: Path,
        bucket: s3.IBucket,
        facts: Mapping[str, Any],
        users: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        check_lifecycle_dir(source_dir)
        self.deployment = deploy_to_prefix(
            self,
            "Deployment",
            bucket=bucket,
            prefix=LIFECYCLE_PREFIX,
            sources=[
                s3_deployment.Source.asset(str(source_dir), exclude=CACHE_EXCLUDES),
                s3_deployment.Source.json_data(CLUSTER_FACTS_FILE, dict(facts)),
                s3_deployment.Source.json_data(USERS_FILE, dict(users or {"teams": [], "users": []})),
            ],
        )
