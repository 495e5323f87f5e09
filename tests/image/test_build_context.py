"""The image's build context, computed by aws-cdk-lib itself: a DockerImageAsset on payloads/ stages
exactly the directory that `cdk deploy` later hands to `docker build`, and its hash is the image tag.
So these tests use CDK's own .dockerignore handling instead of re-implementing it."""

from __future__ import annotations

import shutil
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ecr_assets as ecr_assets
from image_files import PAYLOADS

# What the Dockerfile needs, plus the two files CDK always keeps (Dockerfile, .dockerignore).
EXPECTED_CONTEXT = {"Dockerfile", ".dockerignore", "requirements-cluster.txt", "image/verify_env.py"}


def stage(directory: Path, outdir: Path) -> tuple[str, set[str]]:
    """(asset hash, files in the staged context) of an image asset built from `directory`."""
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "ImageContextProbe")
    asset = ecr_assets.DockerImageAsset(
        stack, "Image", directory=str(directory), file="Dockerfile", platform=ecr_assets.Platform.LINUX_AMD64
    )
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
