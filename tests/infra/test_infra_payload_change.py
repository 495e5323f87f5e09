"""A payload-only change redeploys only the payload upload: never the cluster, FSx, network or image."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk import App, Stack

from stacks.image import TrainingImage

pytestmark = pytest.mark.xdist_group("infra")

PAYLOAD_FILE = Path("payloads/llm_pipeline/config.py")


def changed_resources(before: dict, after: dict) -> set[str]:
    ids = set(before["Resources"]) | set(after["Resources"])
    return {i for i in ids if before["Resources"].get(i) != after["Resources"].get(i)}


def test_payload_edit_changes_only_the_payload_deployment(synth, sources_copy, synthesize_from):
    edited = sources_copy / PAYLOAD_FILE
    edited.write_text(edited.read_text() + "\n# a payload-only edit\n")
    after = synthesize_from(sources_copy)
    changed = changed_resources(synth.template, after.template)
    payload_deployment = synth.cfn_ids_under(synth.stack.payloads, "Custom::CDKBucketDeployment")
    assert changed == payload_deployment, "only the payloads/ upload may change"
    assert after.template["Outputs"] == synth.template["Outputs"]
    before_images, after_images = synth.assets_manifest()["dockerImages"], after.assets_manifest()["dockerImages"]
    assert before_images.keys() == after_images.keys(), "the image (and its tag) is untouched"


def image_hash(context_dir: Path) -> str:
    stack = Stack(App(), "ImageOnly")
    return TrainingImage(stack, "Image", context_dir=context_dir).asset.asset_hash


def test_image_hash_ignores_payload_code_but_tracks_the_image_inputs(sources_copy):
    payloads = sources_copy / "payloads"
    original = image_hash(payloads)
    for path in (payloads / "llm_pipeline").rglob("*.py"):
        path.write_text(path.read_text() + "\n# edited\n")
    (payloads / "llm_pipeline" / "new_step.py").write_text("print('new')\n")
    assert image_hash(payloads) == original
    pins = payloads / "requirements-cluster.txt"
    pins.write_text(pins.read_text() + "\n# a pin change rebuilds the image\n")
    assert image_hash(payloads) != original


def test_payload_upload_skips_image_inputs_tests_and_caches(synth):
    deployment = synth.cfn_ids_under(synth.stack.payloads, "Custom::CDKBucketDeployment").pop()
    (key,) = synth.template["Resources"][deployment]["Properties"]["SourceObjectKeys"]
    staged = synth.outdir / f"asset.{key.removesuffix('.zip')}"
    names = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert "llm_pipeline/config.py" in names and "requirements-cluster.txt" in names
    unwanted = [
        n
        for n in names
        if n in {"Dockerfile", ".dockerignore"}
        or n.startswith(("image/", "tests/"))
        or "__pycache__" in n
        or n.endswith(".pyc")
    ]
    assert unwanted == []
    assert synth.template["Resources"][deployment]["Properties"]["DestinationBucketKeyPrefix"] == "payloads/"
