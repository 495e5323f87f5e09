"""Payload delivery: payloads/ to s3://<bucket>/payloads/, which FSx imports as /fsx/payloads.

A separate deployment from the lifecycle upload, and nothing else refers to it, so a payload-only
change updates this one custom resource and never the cluster, FSx or network. It also writes
deploy-facts.json (the runtime and each partition's image URI): the lifecycle's cluster facts reach
a node only when it is provisioned, these reach /fsx/payloads on every deploy, where submit reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

from cluster_contract import (
    PAYLOAD_CODE_DIGEST_FILE,
    PAYLOADS_FOLDER,
    RUN_CONFIGS_FOLDER,
    payload_code_digest,
)
from llm_pipeline.config import TOMLI_WHEEL
from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE, KEYS, OPTIONAL_PARTITION_KEYS, PARTITION_KEYS
from stacks.image import ALL_RECIPES
from stacks.uploads import CACHE_EXCLUDES, deploy_to_prefix
from stacks.validation import StackError

# Image-build inputs reach the nodes inside the image, tests never leave the repo.
# A local deploy-facts.json would collide with the generated one.
PAYLOAD_EXCLUDES = [
    *CACHE_EXCLUDES,
    "tests",
    *sorted({recipe.dockerfile for recipe in ALL_RECIPES}),
    ".dockerignore",
    "image",
    DEPLOY_FACTS_FILE,
    PAYLOAD_CODE_DIGEST_FILE,
    RUN_CONFIGS_FOLDER,
]


class DeployFactsError(StackError):
    """The stack's deploy facts do not match what submit reads (llm_pipeline.jobs.deploy_facts.KEYS)."""


def deploy_facts(cluster_facts: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the cluster facts that changes with a deploy, in the shape submit reads."""
    return {
        "runtime": cluster_facts["runtime"],
        "default_partition": cluster_facts["default_partition"],
        "partition_images": {name: facts["image_uri"] for name, facts in cluster_facts["partitions"].items()},
        # What submit picks a partition by and hands its jobs (llm_pipeline.jobs.partitions).
        "partitions": {
            name: {key: facts[key] for key in (*PARTITION_KEYS, *OPTIONAL_PARTITION_KEYS) if key in facts}
            for name, facts in cluster_facts["partitions"].items()
        },
    }


class PayloadUpload(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source_dir: Path,
        bucket: s3.IBucket,
        deploy_facts: Mapping[str, Any],
    ) -> None:
        super().__init__(scope, construct_id)
        tomli = source_dir / "llm_pipeline" / TOMLI_WHEEL
        if not tomli.is_file():  # the controller's Python 3.10 reads run configs with it (tools/ship_tomli.py)
            raise StackError(f"{tomli} is missing: `make venv` fetches it (the controller reads run configs with it)")
        if sorted(deploy_facts) != sorted(KEYS):
            raise DeployFactsError(f"deploy facts {sorted(deploy_facts)} differ from what submit reads: {sorted(KEYS)}")
        self.deployment = deploy_to_prefix(
            self,
            "Deployment",
            bucket=bucket,
            prefix=PAYLOADS_FOLDER,
            sources=[
                s3_deployment.Source.asset(str(source_dir), exclude=PAYLOAD_EXCLUDES),
                s3_deployment.Source.json_data(DEPLOY_FACTS_FILE, dict(deploy_facts)),
                s3_deployment.Source.data(PAYLOAD_CODE_DIGEST_FILE, payload_code_digest(source_dir) + "\n"),
            ],
            keep=(f"{RUN_CONFIGS_FOLDER}/*",),  # configs hpctl submit sent; a running chain still reads them
        )
