"""A payload-only change redeploys only the payload upload: never the cluster, FSx, network or image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import App, Stack

from cluster_contract import PAYLOAD_CODE_DIGEST_FILE, RUN_CONFIGS_FOLDER, payload_code_digest
from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE, KEYS, read_deploy_facts, read_partitions
from llm_pipeline.jobs.partitions import partition_environment
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
    before_images, after_images = synth.training_images(), after.training_images()
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


def staged_sources(synth) -> list[set[str]]:
    """The files of each source of the payload upload, as cdk.out stages them."""
    keys = payload_deployment(synth)[1]["SourceObjectKeys"]
    folders = [synth.outdir / f"asset.{key.removesuffix('.zip')}" for key in keys]
    return [{p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} for folder in folders]


def test_payload_upload_skips_image_inputs_tests_and_caches(synth):
    names, facts, digest = staged_sources(synth)
    assert facts == {DEPLOY_FACTS_FILE} and digest == {PAYLOAD_CODE_DIGEST_FILE}
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
    assert payload_deployment(synth)[1]["DestinationBucketKeyPrefix"] == "payloads/"


def test_the_upload_records_the_payload_code_digest_and_keeps_submitted_configs(synth, sources_copy):
    """hpctl compares the checkout with this digest; a deploy's prune must not delete a config a chain reads."""
    _, props = payload_deployment(synth)
    digest_key = props["SourceObjectKeys"][2]
    staged = synth.outdir / f"asset.{digest_key.removesuffix('.zip')}" / PAYLOAD_CODE_DIGEST_FILE
    before = payload_code_digest(sources_copy / "payloads")  # the same bytes the synth read
    assert staged.read_text() == before + "\n"
    assert props["Exclude"] == [f"{RUN_CONFIGS_FOLDER}/*"] and props["Prune"] is True
    (sources_copy / "payloads/configs/extra.toml").write_text("")  # configs are not code
    assert payload_code_digest(sources_copy / "payloads") == before
    script = sources_copy / "payloads/slurm/accelerator_env.sh"
    script.write_text(script.read_text() + "# edited\n")
    assert payload_code_digest(sources_copy / "payloads") != before


def payload_deployment(synth) -> tuple[str, dict]:
    deployment = synth.cfn_ids_under(synth.stack.payloads, "Custom::CDKBucketDeployment").pop()
    return deployment, synth.template["Resources"][deployment]["Properties"]


def image_tag(synth) -> str:
    (image,) = synth.training_images().values()
    (destination,) = image["destinations"].values()
    return destination["imageTag"]


def rendered_deploy_facts(synth, folder: Path) -> Path:
    """deploy-facts.json as the upload handler writes it: each marker replaced by its deploy-time value."""
    _, props = payload_deployment(synth)
    _, facts_key, _ = props["SourceObjectKeys"]
    _, markers, _ = props["SourceMarkers"]
    text = (synth.outdir / f"asset.{facts_key.removesuffix('.zip')}" / DEPLOY_FACTS_FILE).read_text()
    for marker, value in markers.items():  # Fn::Join ['"', Fn::Sub '<uri>', '"'] for an image URI
        parts = value["Fn::Join"][1]
        rendered = "".join(part if isinstance(part, str) else part["Fn::Sub"] for part in parts)
        text = text.replace(marker, rendered.replace("${AWS::URLSuffix}", "amazonaws.com"))
    (folder / DEPLOY_FACTS_FILE).write_text(text)
    return folder


def test_an_image_change_reaches_the_payloads_deploy_facts_not_the_cluster(
    synth, sources_copy, synthesize_from, tmp_path
):
    """The nodes' profile has the image of their provisioning; /fsx/payloads/deploy-facts.json has the latest,
    and submit's own reader finds it there."""
    pins = sources_copy / "payloads" / "requirements-cluster.txt"
    pins.write_text(pins.read_text() + "\n# a pin change rebuilds the image\n")
    after = synthesize_from(sources_copy)
    old_tag, new_tag = image_tag(synth), image_tag(after)
    assert old_tag != new_tag

    changed = changed_resources(synth.template, after.template)
    uploads = synth.cfn_ids_under(synth.stack.payloads) | synth.cfn_ids_under(synth.stack.lifecycle)
    assert synth.cfn_ids_under(synth.stack.payloads, "Custom::CDKBucketDeployment") <= changed
    assert changed <= uploads, f"only the uploads may change, not {sorted(changed - uploads)}"
    for which, tag in ((synth, old_tag), (after, new_tag)):
        folder = tmp_path / tag
        folder.mkdir()
        facts = read_deploy_facts(rendered_deploy_facts(which, folder))
        assert facts["HPL_IMAGE_URI"].endswith(f":{tag}"), facts
        assert facts["HPL_RUNTIME"] == synth.config.runtime


def test_deploy_facts_name_every_partitions_image(named_synths, tmp_path):
    mixed = named_synths["mixed"]  # a trn1 and a g5 partition: one image per accelerator family
    facts_file = rendered_deploy_facts(mixed, tmp_path) / DEPLOY_FACTS_FILE
    written = json.loads(facts_file.read_text())
    assert sorted(written) == sorted(KEYS)
    assert written["default_partition"] == mixed.config.default_group.partition
    images = {
        group.partition: read_deploy_facts(tmp_path, partition=group.partition)["HPL_IMAGE_URI"]
        for group in mixed.config.compute_groups
    }
    assert set(images) == set(written["partition_images"]) == {"trn1", "g5"}
    assert len(set(images.values())) == 2 and all(
        uri.startswith(f"{mixed.config.account}.dkr.ecr.") for uri in images.values()
    )


def test_a_payload_tree_without_tomli_s_wheel_is_refused_at_synth_naming_it(sources_copy, synthesize_from):
    """The controller's Python 3.10 reads run configs with the wheel tools/ship_tomli.py fetches: no deploy without."""
    from llm_pipeline.config import TOMLI_WHEEL
    from stacks.validation import StackError

    wheel = sources_copy / "payloads" / "llm_pipeline" / TOMLI_WHEEL
    wheel.unlink()
    with pytest.raises(StackError, match=rf"^{wheel} is missing: `make venv` fetches it"):
        synthesize_from(sources_copy)


def test_each_partition_names_its_familys_serving_image_and_a_host_runtime_builds_none(
    named_synths, synthesize_from, source_root, tmp_path
):
    """A Pyxis cluster builds one serving image per family (payloads/Dockerfile.serve, the family its build
    argument) and each partition's deploy facts name its own, which submit hands every job as
    HPL_SERVING_IMAGE_URI; a host runtime serves from the nodes' own vLLM site: no serving image, no fact."""
    mixed = named_synths["mixed"]  # a trn1 and a g5 partition
    serving = mixed.serving_images()
    assert sorted(serving.values()) == ["cuda", "neuron"]
    tag_of = {family: tag for tag, family in serving.items()}
    folder = rendered_deploy_facts(mixed, tmp_path)
    known, _ = read_partitions(folder)
    for group in mixed.config.compute_groups:
        env = partition_environment(group.partition, known[group.partition])
        training = read_deploy_facts(folder, partition=group.partition)["HPL_IMAGE_URI"]
        family = mixed.config.image_family_of(group)
        assert env["HPL_SERVING_IMAGE_URI"].endswith(f":{tag_of[family]}") and env["HPL_SERVING_IMAGE_URI"] != training
        assert env["HPL_SERVING_IMAGE_URI"].rpartition(":")[0] == training.rpartition(":")[0]  # one assets repository

    host = synthesize_from(source_root, runtime="host")
    assert host.serving_images() == {}
    host_folder = tmp_path / "host"
    host_folder.mkdir()
    host_known, _ = read_partitions(rendered_deploy_facts(host, host_folder))
    assert {facts["serving_image_uri"] for facts in host_known.values()} == {""}
    assert all("HPL_SERVING_IMAGE_URI" not in partition_environment(n, f) for n, f in host_known.items())
