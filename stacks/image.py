"""Images: one training image per accelerator family and lane the config uses, and on a Pyxis cluster one serving
image (vLLM) per family, built at deploy and pushed to ECR."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

from stacks.accelerators import CLUSTER_ONLY_FAMILIES, CUDA, NEURON, TORCHNEURON

# The two variants AWS publishes of each PyTorch image release (aws/deep-learning-containers,
# docs/src/data/pytorch/<version>-cuda-{ec2,sagemaker}.yml): ec2 (the plain tag) for the HyperPod cluster
# lane, sagemaker (the SageMaker training toolkit and SDK on the same PyTorch/CUDA/EFA stack) for training
# jobs. payloads/Dockerfile.cuda names each variant's full tag in a stage `base-<variant>`.
DlcVariant = Literal["ec2", "sagemaker"]
DLC_VARIANTS: tuple[DlcVariant, ...] = get_args(DlcVariant)
CLUSTER_VARIANT: DlcVariant = "ec2"
JOB_VARIANT: DlcVariant = "sagemaker"
VARIANT_BUILD_ARG = "DLC_VARIANT"  # payloads/Dockerfile.cuda's ARG before FROM (default ec2)
Lane = Literal["cluster", "jobs"]
LANE_VARIANTS: dict[Lane, DlcVariant] = {"cluster": CLUSTER_VARIANT, "jobs": JOB_VARIANT}


@dataclass(frozen=True)
class ImageRecipe:
    """How one family's image is built from payloads/: its Dockerfile, the pins it installs and, where
    its base comes in DLC variants, which ones (the first is the Dockerfile's default)."""

    construct_id: str
    dockerfile: str
    requirements: str
    display_name: str
    variants: tuple[DlcVariant, ...] = ()

    def variant_for(self, lane: Lane) -> DlcVariant | None:
        return LANE_VARIANTS[lane] if self.variants else None

    def names(self, variant: DlcVariant | None) -> tuple[str, str]:
        """(construct id, display name): the default variant keeps the plain names, so the cluster
        lane's image asset and its logical ids stay what they were before variants existed."""
        if variant is None or variant == self.variants[0]:
            return self.construct_id, self.display_name
        return f"{self.construct_id}{variant.capitalize()}", f"{self.display_name}-{variant}"


RECIPES = {
    NEURON: ImageRecipe("TrainingImage", "Dockerfile", "requirements-cluster.txt", "training-image"),
    # Trainium2: TorchNeuron (torch-neuronx's native device) with the main stack's pins
    TORCHNEURON: ImageRecipe("Trn2TrainingImage", "Dockerfile.trn2", "requirements-trn2.txt", "training-image-trn2"),
    CUDA: ImageRecipe(
        "CudaTrainingImage", "Dockerfile.cuda", "requirements-gpu.txt", "training-image-cuda", DLC_VARIANTS
    ),
}


# The serving images: one Dockerfile whose base stage is the family's published vLLM image (the build argument
# names the family, so each is its own tag), one pins file (lm-eval). The steps that start a vLLM server on the
# nodes run in it under Pyxis (payloads/slurm/env.sh, hpl_vllm_srun).
SERVING_FAMILY_BUILD_ARG = "SERVING_FAMILY"  # payloads/Dockerfile.serve's ARG before FROM (default cuda)
SERVING_RECIPES = {
    family: ImageRecipe(f"{prefix}ServingImage", "Dockerfile.serve", "requirements-serve.txt", f"serving-image{suffix}")
    for family, prefix, suffix in ((NEURON, "", ""), (TORCHNEURON, "Trn2", "-trn2"), (CUDA, "Cuda", "-cuda"))
}
ALL_RECIPES = (*RECIPES.values(), *SERVING_RECIPES.values())


class TrainingImage(Construct):
    """A CDK Docker image asset (cdk-assets builds and pushes it on deploy; synth needs no Docker).

    The build context is payloads/, cut down by payloads/.dockerignore to the files the
    Dockerfiles copy (pinned requirements, the check script), and further here to this family's
    own files, so payload code changes, and the other family's pins, leave this asset hash, and
    with it the image tag and the cluster facts, untouched. A CUDA image names its base's DLC
    variant as a build argument, which CDK counts in the asset hash: each variant is its own tag.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        context_dir: Path,
        family: str = NEURON,
        variant: DlcVariant | None = None,
        serving: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        recipe = SERVING_RECIPES[family] if serving else RECIPES[family]
        if variant is None and recipe.variants:
            variant = recipe.variants[0]
        if variant is not None and variant not in recipe.variants:
            allowed = ", ".join(recipe.variants) or "none (its base has no variants)"
            raise ValueError(f"the {family} image has no base variant {variant!r}; variants: {allowed}")
        own = {recipe.dockerfile, recipe.requirements}
        others = sorted({path for other in ALL_RECIPES for path in (other.dockerfile, other.requirements)} - own)
        self.family = family
        self.variant = variant
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(context_dir),
            file=recipe.dockerfile,
            build_args=self._build_args(family, variant, serving),
            ignore_mode=IgnoreMode.DOCKER,
            exclude=others,
            platform=ecr_assets.Platform.LINUX_AMD64,  # Trainium and the GPU instances are x86_64
            display_name=recipe.names(variant)[1],
        )

    @staticmethod
    def _build_args(family: str, variant: DlcVariant | None, serving: bool) -> dict[str, str] | None:
        if serving:
            return {SERVING_FAMILY_BUILD_ARG: family}
        return {VARIANT_BUILD_ARG: variant} if variant else None

    @property
    def image_uri(self) -> str:
        return self.asset.image_uri


def serving_images(scope: Construct, *, context_dir: Path, families: tuple[str, ...]) -> dict[str, TrainingImage]:
    """The serving image of each family the cluster's groups use."""
    return {
        family: TrainingImage(
            scope, SERVING_RECIPES[family].construct_id, context_dir=context_dir, family=family, serving=True
        )
        for family in families
    }


def lane_images(
    scope: Construct, *, context_dir: Path, families: tuple[str, ...], lanes: tuple[Lane, ...]
) -> dict[Lane, dict[str, TrainingImage]]:
    """Each lane's image per family; an image both lanes run (the Neuron one) is built once. A CUDA
    family gets the ec2 variant for the cluster and the sagemaker variant for jobs, each only where
    its lane is deployed."""
    built: dict[tuple[str, DlcVariant | None], TrainingImage] = {}
    images: dict[Lane, dict[str, TrainingImage]] = {}
    for lane in lanes:
        for family in families:
            recipe = RECIPES[family]
            if lane == "jobs" and family in CLUSTER_ONLY_FAMILIES:
                continue
            variant = recipe.variant_for(lane)
            if (family, variant) not in built:
                construct_id, _ = recipe.names(variant)
                built[family, variant] = TrainingImage(
                    scope, construct_id, context_dir=context_dir, family=family, variant=variant
                )
            images.setdefault(lane, {})[family] = built[family, variant]
    return images
