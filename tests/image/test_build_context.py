"""The images' build contexts, computed by aws-cdk-lib itself: the stack's TrainingImage (a
DockerImageAsset on payloads/) stages exactly the directory that `cdk deploy` later hands to
`docker build`, and its hash is the image tag. So these tests use CDK's own .dockerignore handling
instead of re-implementing it, for the Neuron and the CUDA image alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import aws_cdk as cdk
import pytest
from image_files import PAYLOADS

from stacks.image import TrainingImage

# What each Dockerfile needs, plus the two files CDK always keeps (its Dockerfile, .dockerignore).
EXPECTED_CONTEXT = {"Dockerfile", ".dockerignore", "requirements-cluster.txt", "image/verify_env.py"}
EXPECTED_CUDA_CONTEXT = {"Dockerfile.cuda", ".dockerignore", "requirements-gpu.txt", "image/verify_env.py"}


def stage(directory: Path, outdir: Path, family: str = "neuron", variant: str | None = None) -> tuple[str, set[str]]:
    """(asset hash, files in the staged context) of the stack's image asset built from `directory`."""
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "ImageContextProbe")
    asset = TrainingImage(stack, "Image", context_dir=directory, family=family, variant=variant).asset
    staged = outdir / f"asset.{asset.asset_hash}"  # CDK's staging folder name for the asset
    assert staged.is_dir(), f"CDK staged no context at {staged}"
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    return asset.asset_hash, files


@pytest.fixture()
def payloads_copy(tmp_path) -> Path:
    """A private copy of payloads/, safe to edit while other areas work in the checkout."""
    copy = tmp_path / "payloads"
    shutil.copytree(PAYLOADS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_context_holds_only_what_the_build_needs(tmp_path):
    _, files = stage(PAYLOADS, tmp_path / "out")
    assert files == EXPECTED_CONTEXT
    _, cuda_files = stage(PAYLOADS, tmp_path / "cuda", "cuda")
    assert cuda_files == EXPECTED_CUDA_CONTEXT


def test_each_image_ignores_the_other_familys_pins(payloads_copy, tmp_path):
    neuron, cuda = stage(payloads_copy, tmp_path / "n0")[0], stage(payloads_copy, tmp_path / "c0", "cuda")[0]
    gpu_pins = payloads_copy / "requirements-gpu.txt"
    gpu_pins.write_text(gpu_pins.read_text() + "# touched\n")
    assert stage(payloads_copy, tmp_path / "n1")[0] == neuron
    assert stage(payloads_copy, tmp_path / "c1", "cuda")[0] != cuda


def test_payload_code_changes_keep_the_image_hash(payloads_copy, tmp_path):
    before, _ = stage(payloads_copy, tmp_path / "before")
    (payloads_copy / "llm_pipeline").mkdir(exist_ok=True)
    (payloads_copy / "llm_pipeline" / "added_step.py").write_text("print('new step')\n")
    (payloads_copy / "slurm").mkdir(exist_ok=True)
    (payloads_copy / "slurm" / "extra.sbatch").write_text("#!/bin/bash\n")
    (payloads_copy / "image" / "__pycache__").mkdir()
    (payloads_copy / "image" / "__pycache__" / "verify_env.cpython-311.pyc").write_bytes(b"\0")
    after, files = stage(payloads_copy, tmp_path / "after")
    assert after == before
    assert files == EXPECTED_CONTEXT


def test_requirement_and_check_changes_change_the_image_hash(payloads_copy, tmp_path):
    before, _ = stage(payloads_copy, tmp_path / "before")
    requirements = payloads_copy / "requirements-cluster.txt"
    requirements.write_text(requirements.read_text() + "# touched\n")
    after_pins, _ = stage(payloads_copy, tmp_path / "pins")
    check = payloads_copy / "image" / "verify_env.py"
    check.write_text(check.read_text() + "# touched\n")
    after_check, _ = stage(payloads_copy, tmp_path / "check")
    assert len({before, after_pins, after_check}) == 3


def test_each_cuda_variant_is_its_own_tag_from_the_same_context(tmp_path):
    """The variant travels as a build argument, which CDK counts in the asset hash (so in the tag);
    the files staged for the build are the same, and no variant is the ec2 one, the Dockerfile's default."""
    default, default_files = stage(PAYLOADS, tmp_path / "default", "cuda")
    ec2, ec2_files = stage(PAYLOADS, tmp_path / "ec2", "cuda", "ec2")
    sagemaker, sagemaker_files = stage(PAYLOADS, tmp_path / "sagemaker", "cuda", "sagemaker")
    assert default == ec2 != sagemaker
    assert default_files == ec2_files == sagemaker_files == EXPECTED_CUDA_CONTEXT


@pytest.mark.parametrize(("family", "variant"), [("cuda", "Sagemaker"), ("cuda", "gpu"), ("neuron", "sagemaker")])
def test_only_the_bases_published_variants_are_accepted(tmp_path, family, variant):
    with pytest.raises(ValueError, match=f"the {family} image has no base variant '{variant}'"):
        stage(PAYLOADS, tmp_path / "out", family, variant)
