"""The observability modes in the template: the AMP workspace, the node role's one right on it, the
pinned exporter images, and a clean cfn-lint and cdk-nag in every mode."""

from __future__ import annotations

import json

import pytest
from test_infra_lint_nag import nag_report, template_path

from cluster_contract import FACT_KEYS, ObservabilityOutput
from stacks.lint import lint_template
from stacks.observability import UPSTREAM_BUILD_ARG, UPSTREAM_IMAGES

pytestmark = pytest.mark.xdist_group("infra")


def node_statements(synth) -> list[dict]:
    _, policy = next(
        (key, res)
        for key, res in synth.resources("AWS::IAM::Policy").items()
        if key.startswith("ClusterRoleNodeAccess")
    )
    return policy["Properties"]["PolicyDocument"]["Statement"]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_the_stack_owns_one_workspace_deleted_with_it(synth):
    key, workspace = synth.one("AWS::APS::Workspace")
    assert workspace["DeletionPolicy"] == "Delete" and workspace["UpdateReplacePolicy"] == "Delete"
    assert workspace["Properties"]["Alias"] == f"{synth.config.cluster_name}-metrics"
    outputs = synth.template["Outputs"]
    assert outputs[ObservabilityOutput.MODE]["Value"] == "prometheus"
    assert outputs[ObservabilityOutput.METRICS_ENDPOINT]["Value"] == {"Fn::GetAtt": [key, "PrometheusEndpoint"]}


def test_remote_write_is_the_only_aps_right_and_it_names_the_workspace_arn(synth):
    key, _ = synth.one("AWS::APS::Workspace")
    aps = [s for s in node_statements(synth) if any(a.startswith("aps:") for a in as_list(s["Action"]))]
    assert aps == [
        {
            "Sid": "RemoteWriteMetrics",
            "Action": "aps:RemoteWrite",
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [key, "Arn"]},
        }
    ]


def test_the_lifecycle_facts_name_the_workspace_and_the_stack_images(synth):
    key, _ = synth.one("AWS::APS::Workspace")
    facts = synth.stack.facts  # what the lifecycle upload writes as cluster-facts.json
    assert tuple(facts) == FACT_KEYS
    url = json.dumps(synth.stack.resolve(facts["metrics_remote_write_url"]))
    assert f'"{key}", "PrometheusEndpoint"' in url and url.endswith('"api/v1/remote_write"]]}')
    assert facts["metrics_textfile_path"] == "/var/lib/hyperpod-lora/metrics"
    assert facts["dcgm_exporter_image"] == ""  # trn1 only: no GPU, no DCGM image
    for fact in ("node_exporter_image", "collector_image"):
        assert "dkr.ecr" in json.dumps(synth.stack.resolve(facts[fact]))


def test_exporter_images_are_built_from_digest_pins_into_the_stacks_repository(synth, named_synths):
    for each, expected in ((synth, 2), (named_synths["gpu-only"], 3)):
        images = each.assets_manifest()["dockerImages"].values()
        upstream = [i["source"].get("dockerBuildArgs", {}).get(UPSTREAM_BUILD_ARG) for i in images]
        pinned = [ref for ref in upstream if ref]
        assert len(pinned) == expected and set(pinned) <= set(UPSTREAM_IMAGES.values())
        assert all("@sha256:" in ref and len(ref.split("@sha256:")[1]) == 64 for ref in pinned)
        destinations = {d["repositoryName"] for i in images for d in i["destinations"].values()}
        assert len(destinations) == 1  # the stack's CDK assets repository, which the node role may pull from


@pytest.mark.parametrize("mode", ["managed", "off"])
def test_other_modes_create_no_workspace_and_grant_nothing_on_aps(mode_synths, mode):
    synth = mode_synths[mode]
    assert synth.resources("AWS::APS::Workspace") == {}
    assert not [s for s in node_statements(synth) if any(a.startswith("aps:") for a in as_list(s["Action"]))]
    assert synth.template["Outputs"][ObservabilityOutput.MODE]["Value"] == mode
    assert ObservabilityOutput.METRICS_ENDPOINT not in synth.template["Outputs"]
    images = synth.assets_manifest()["dockerImages"].values()
    assert not [i for i in images if UPSTREAM_BUILD_ARG in i["source"].get("dockerBuildArgs", {})]


@pytest.mark.parametrize("mode", ["managed", "off"])
def test_other_modes_lint_and_nag_clean(mode_synths, mode):
    synth = mode_synths[mode]
    matches = lint_template(template_path(synth), ["us-west-2"])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []
    report = nag_report(synth)
    assert (report["conclusion"], report["violations"]) == ("success", [])
