"""The lifecycle upload: the OnInitComplete script plus generated facts, and never the legacy file."""

from __future__ import annotations

import json

import pytest

from cluster_contract import CLUSTER_FACTS_FILE
from stacks.build import REPO_ROOT
from stacks.config import LEGACY_PROVISIONING_FILE, LIFECYCLE_SCRIPT, cluster_facts, observability_facts
from stacks.lifecycle import LifecycleLayoutError, check_lifecycle_dir

pytestmark = pytest.mark.xdist_group("infra")


def lifecycle_deployment(synth) -> dict:
    (logical_id,) = synth.cfn_ids_under(synth.stack.lifecycle, "Custom::CDKBucketDeployment")
    return synth.template["Resources"][logical_id]["Properties"]


def staged_files(synth) -> dict[str, str]:
    """Every file the lifecycle deployment uploads, by name, read from the staged assets."""
    files = {}
    for key in lifecycle_deployment(synth)["SourceObjectKeys"]:
        staged = synth.outdir / f"asset.{key.removesuffix('.zip')}"
        files.update({p.relative_to(staged).as_posix(): p.read_text() for p in staged.rglob("*") if p.is_file()})
    return files


def test_the_repository_lifecycle_folder_is_valid():
    check_lifecycle_dir(REPO_ROOT / "lifecycle")
    assert not list((REPO_ROOT / "lifecycle").rglob(LEGACY_PROVISIONING_FILE))


def test_upload_goes_to_the_prefix_the_cluster_reads(synth):
    props = lifecycle_deployment(synth)
    assert props["DestinationBucketKeyPrefix"] == "lifecycle/"
    assert props["Prune"] is True, "a stale provisioning_parameters.json from an old deploy would be removed"
    assert synth.config.lifecycle_s3_uri == f"s3://{synth.config.bucket_name}/lifecycle/"


def test_uploaded_files_are_the_script_and_the_generated_facts_only_no_legacy_file(synth):
    files = staged_files(synth)
    assert LIFECYCLE_SCRIPT in files and CLUSTER_FACTS_FILE in files
    assert not [name for name in files if name.endswith(LEGACY_PROVISIONING_FILE)]
    assert not [name for name in files if "__pycache__" in name]


def test_generated_facts_hold_the_config_and_the_image_uri(synth):
    text = staged_files(synth)[CLUSTER_FACTS_FILE]
    props = lifecycle_deployment(synth)
    # The image URI is a deploy-time value: CDK leaves a marker the deployment fills in.
    (markers,) = [m for m in props["SourceMarkers"] if m]
    # One per place an image URI appears (default group, its partition and serving image, the exporters), the
    # remote write URL, the Hugging Face token's secret ARN and the alerts topic's.
    for marker in markers:
        value = json.dumps(markers[marker])
        stands_for = {
            "PrometheusEndpoint": '"WRITE"',
            "HubTokenSecret": '"SECRET"',
            "container-assets": '"IMAGE"',
            "AlertsTopic": '"TOPIC"',
        }
        (replacement,) = [stand_in for key, stand_in in stands_for.items() if key in value]
        text = text.replace(marker, replacement)
    facts = json.loads(text)
    metrics = observability_facts(
        synth.config, remote_write_url="WRITE", exporter_images={"node_exporter": "IMAGE", "prometheus": "IMAGE"}
    )
    assert facts == cluster_facts(
        synth.config,
        image_uris={"neuron": "IMAGE"},
        serving_image_uris={"neuron": "IMAGE"},  # a Pyxis cluster's serving image (the default runtime)
        metrics=metrics,
        hf_token_secret_arn="SECRET",
        alerts_topic_arn="TOPIC",
    )


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({}, f"{LIFECYCLE_SCRIPT} is missing"),
        ({LIFECYCLE_SCRIPT: "", f"sub/{LEGACY_PROVISIONING_FILE}": "{}"}, "HyperPod rejects it"),
        ({LIFECYCLE_SCRIPT: "", CLUSTER_FACTS_FILE: "{}"}, "the stack generates it"),
    ],
)
def test_bad_lifecycle_layouts_stop_synth(tmp_path, layout, message):
    for name, content in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    with pytest.raises(LifecycleLayoutError, match=message):
        check_lifecycle_dir(tmp_path)
