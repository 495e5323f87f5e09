"""Image: the training image, built from payloads/Dockerfile at deploy and pushed to ECR."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

DOCKERFILE = "Dockerfile"


class TrainingImage(Construct):
    """A CDK Docker image asset (cdk-assets builds and pushes it on deploy; synth needs no Docker).

    The build context is payloads/, cut down by payloads/.dockerignore to the files the
    Dockerfile copies (the pinned requirements), so payload code changes leave the asset hash,
    and with it the image tag and the cluster facts, untouched.
    """

    def __init__(self, scope: Construct, construct_id: str, *, context_dir: Path) -> None:
        super().__init__(scope, construct_id)
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(context_dir),
            file=DOCKERFILE,
            ignore_mode=IgnoreMode.DOCKER,
            platform=ecr_assets.Platform.LINUX_AMD64,  # Trainium hosts are x86_64
            display_name="training-image",
        )

    @property
    def image_uri(self) -> str:
        return self.asset.image_uri
