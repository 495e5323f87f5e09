"""Images: one training image per accelerator family the config uses, built at deploy and pushed to ECR."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

from stacks.accelerators import CUDA, NEURON


@dataclass(frozen=True)
class ImageRecipe:
    """How one family's image is built from payloads/: its Dockerfile and the pins it installs."""

    construct_id: str
    dockerfile: str
    requirements: str
    display_name: str


RECIPES = {
    NEURON: ImageRecipe("TrainingImage", "Dockerfile", "requirements-cluster.txt", "training-image"),
    CUDA: ImageRecipe("CudaTrainingImage", "Dockerfile.cuda", "requirements-gpu.txt", "training-image-cuda"),
}


class TrainingImage(Construct):
    """A CDK Docker image asset (cdk-assets builds and pushes it on deploy; synth needs no Docker).

    The build context is payloads/, cut down by payloads/.dockerignore to the files the
    Dockerfiles copy (pinned requirements, the check script), and further here to this family's
    own files, so payload code changes, and the other family's pins, leave this asset hash, and
    with it the image tag and the cluster facts, untouched.
    """

    def __init__(self, scope: Construct, construct_id: str, *, context_dir: Path, family: str = NEURON) -> None:
        super().__init__(scope, construct_id)
        recipe = RECIPES[family]
        others = [
            path for other in RECIPES.values() if other != recipe for path in (other.dockerfile, other.requirements)
        ]
        self.family = family
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(context_dir),
            file=recipe.dockerfile,
            ignore_mode=IgnoreMode.DOCKER,
            exclude=others,
            platform=ecr_assets.Platform.LINUX_AMD64,  # Trainium and the GPU instances are x86_64
            display_name=recipe.display_name,
        )

    @property
    def image_uri(self) -> str:
        return self.asset.image_uri
