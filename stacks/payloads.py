"""Payload delivery: payloads/ to s3://<bucket>/payloads/, which FSx imports as /fsx/payloads.

A separate deployment from the lifecycle upload, and nothing else refers to it, so a payload-only
change updates this one custom resource and never the cluster, FSx or network.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

from cluster_contract import PAYLOADS_FOLDER
from stacks.image import RECIPES
from stacks.uploads import CACHE_EXCLUDES, deploy_to_prefix

# Image-build inputs reach the nodes inside the image, tests never leave the repo.
PAYLOAD_EXCLUDES = [
    *CACHE_EXCLUDES,
    "tests",
    *(recipe.dockerfile for recipe in RECIPES.values()),
    ".dockerignore",
    "image",
]


class PayloadUpload(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, source_dir: Path, bucket: s3.IBucket) -> None:
        super().__init__(scope, construct_id)
        self.deployment = deploy_to_prefix(
            self,
            "Deployment",
            bucket=bucket,
            prefix=PAYLOADS_FOLDER,
            sources=[s3_deployment.Source.asset(str(source_dir), exclude=PAYLOAD_EXCLUDES)],
        )
