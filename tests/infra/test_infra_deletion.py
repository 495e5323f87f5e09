"""Destroy removes everything unless the user keeps the outputs (retain_outputs=true)."""

from __future__ import annotations

import pytest

from cluster_contract import JOB_LOG_GROUP
from stacks.build import REPO_ROOT
from stacks.config import HyperPodConfig
from stacks.leftovers import left_after_destroy
from stacks.leftovers import main as leftovers_main

pytestmark = pytest.mark.xdist_group("infra")


def data_bucket_id(synth) -> str:
    return synth.logical_id(synth.stack.data.bucket.node.default_child)


def test_default_destroy_leaves_nothing(synth):
    kept = {
        i: r.get("DeletionPolicy")
        for i, r in synth.template["Resources"].items()
        if r.get("DeletionPolicy", "Delete") != "Delete" or r.get("UpdateReplacePolicy", "Delete") != "Delete"
    }
    assert kept == {}
    for kind in (
        "AWS::SageMaker::Cluster",
        "AWS::FSx::FileSystem",
        "AWS::FSx::DataRepositoryAssociation",
        "AWS::S3::Bucket",
        "AWS::Logs::LogGroup",
    ):
        assert all(r.get("DeletionPolicy") == "Delete" for r in synth.resources(kind).values()), kind


def test_buckets_are_emptied_before_deletion(synth):
    emptied = {r["Properties"]["BucketName"]["Ref"] for r in synth.resources("Custom::S3AutoDeleteObjects").values()}
    assert emptied == set(synth.resources("AWS::S3::Bucket"))
    uploads = synth.resources("Custom::CDKBucketDeployment").values()
    assert [u["Properties"]["RetainOnDelete"] for u in uploads] == [False, False]


def test_links_go_before_the_bucket_is_emptied(synth):
    auto_delete = synth.cfn_ids_under(synth.stack.data.bucket, "Custom::S3AutoDeleteObjects")
    for link in synth.resources("AWS::FSx::DataRepositoryAssociation").values():
        assert auto_delete <= set(link["DependsOn"])


def test_retain_outputs_keeps_the_data_bucket_and_its_objects(synth_variant):
    bucket = synth_variant.template["Resources"][data_bucket_id(synth_variant)]
    assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert synth_variant.resources("Custom::S3AutoDeleteObjects") == {}
    for kind in ("AWS::SageMaker::Cluster", "AWS::FSx::FileSystem", "AWS::EC2::VPC"):
        ((_, resource),) = synth_variant.resources(kind).items()
        assert resource.get("DeletionPolicy", "Delete") == "Delete", kind


def test_every_lambda_logs_to_a_group_with_retention_removed_on_destroy(synth):
    """CDK's helper Lambdas would otherwise create /aws/lambda/* groups that never expire and outlive destroy."""
    functions = synth.resources("AWS::Lambda::Function")
    groups = synth.resources("AWS::Logs::LogGroup")
    assert len(functions) == 3, sorted(functions)  # upload handler, S3 auto-delete, VPC default-SG restriction
    for name, function in functions.items():
        target = function["Properties"].get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        assert target in groups, f"{name} has no log group of its own"
        assert groups[target]["Properties"]["RetentionInDays"] == 30, name
        assert groups[target]["DeletionPolicy"] == "Delete", name


def destroy_section() -> str:
    deploy_doc = (REPO_ROOT / "docs" / "deploy.md").read_text()
    return deploy_doc.split("- **Destroy**:", 1)[1].split("\n- **", 1)[0]


def test_the_readme_lists_everything_destroy_leaves():
    everything = HyperPodConfig.from_context({"lanes": "both", "retain_outputs": True}, environ={})
    names = [item.name for item in left_after_destroy(everything)]
    assert len(names) == 5
    section = destroy_section()
    for name in names:
        assert name in section, f"docs/deploy.md's destroy list lacks {name}"
    plain = [item.name for item in left_after_destroy(HyperPodConfig.from_context({}, environ={}))]
    assert "the access-log bucket" not in plain and f"`{JOB_LOG_GROUP}`" not in plain


def test_retain_outputs_keeps_the_access_log_bucket_too(synth_variant):
    """Both buckets stay: leftovers.py and docs/deploy.md say so."""
    buckets = synth_variant.resources("AWS::S3::Bucket").values()
    assert [b["DeletionPolicy"] for b in buckets] == ["Retain", "Retain"]


def test_destroy_prints_what_is_left_with_a_command_each(no_aws_credentials, capsys):
    assert leftovers_main(["-c", "lanes=jobs"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n  remove: ") == 3 and f"{JOB_LOG_GROUP}:" in out and "/aws/sagemaker/Clusters" not in out
