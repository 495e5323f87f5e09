"""The jobs lane (cdk.json `lanes`): a jobs-only deploy has no VPC, FSx or cluster, only the bucket,
the images and a job execution role scoped to the bucket prefixes; synth, snapshot, cfn-lint, cdk-nag."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_infra_lint_nag import nag_report, template_path
from test_infra_snapshot import check_snapshot

from cluster_contract import JOB_INPUT_PREFIXES, JOB_LOG_GROUP, JOB_OUTPUT_PREFIXES, JobStackOutput, StackOutput
from hpctl.job_instances import accelerator, training_instance_types
from hpctl.job_spec import COMPILE_CACHE_PREFIX, DATASETS_PREFIX, JOBS_PREFIX, MODELS_PREFIX, OUTPUTS_PREFIX
from hpctl.job_submit import IMAGE_OUTPUTS, ROLE_OUTPUT
from stacks.accelerators import JOB_INSTANCE_TYPES, JOB_ONLY_INSTANCE_TYPES
from stacks.config import ConfigError, HyperPodConfig
from stacks.lint import lint_template

pytestmark = pytest.mark.xdist_group("infra")

JOBS_ONLY_TYPES = {
    "AWS::S3::Bucket",
    "AWS::S3::BucketPolicy",
    "Custom::S3AutoDeleteObjects",  # empties the bucket on destroy (retain_outputs = false)
    "AWS::Lambda::Function",  # its handler
    "AWS::Logs::LogGroup",  # the handler's log group
    "AWS::IAM::Role",
    "AWS::IAM::Policy",
}


@pytest.fixture(scope="session")
def jobs_synth(synthesize_from, source_root: Path):
    return synthesize_from(source_root, stack_name="HyperPodJobsOnly", lanes="jobs")


def job_policy(synth) -> list[dict]:
    ((_, policy),) = [
        (key, res) for key, res in synth.resources("AWS::IAM::Policy").items() if key.startswith("JobRoleJobAccess")
    ]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def object_prefixes(statement: dict) -> set[str]:
    return {resource["Fn::Join"][1][1].removeprefix("/") for resource in statement["Resource"]}


def test_jobs_only_creates_no_network_file_system_or_cluster(jobs_synth):
    kinds = {resource["Type"] for resource in jobs_synth.template["Resources"].values()}
    assert kinds == JOBS_ONLY_TYPES
    assert "SageMaker training jobs (no cluster)" in jobs_synth.template["Description"]


def test_job_role_reads_inputs_and_writes_only_outputs(jobs_synth):
    ((_, role),) = [(k, r) for k, r in jobs_synth.resources("AWS::IAM::Role").items() if k.startswith("JobRole")]
    trust = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}
    ]
    statements = {s["Sid"]: s for s in job_policy(jobs_synth)}
    every = {f"{prefix}/*" for prefix in (*JOB_INPUT_PREFIXES, *JOB_OUTPUT_PREFIXES)}
    assert object_prefixes(statements["ReadJobFolders"]) == every
    assert object_prefixes(statements["WriteJobOutputs"]) == {f"{prefix}/*" for prefix in JOB_OUTPUT_PREFIXES}
    assert set(statements["ListJobPrefixes"]["Condition"]["StringLike"]["s3:prefix"]) == every
    assert JOB_LOG_GROUP in str(statements["TrainingJobLogs"]["Resource"])
    assert "container-assets" in str(statements["PullTrainingImages"]["Resource"])


def test_outputs_are_what_hpctl_job_reads(jobs_synth):
    outputs = jobs_synth.template["Outputs"]
    assert set(outputs) == {ROLE_OUTPUT, JobStackOutput.NEURON_IMAGE_URI, StackOutput.BUCKET_NAME, StackOutput.REGION}
    assert IMAGE_OUTPUTS["neuron"] == (JobStackOutput.NEURON_IMAGE_URI,)  # default groups: Trainium only
    # The role's prefixes are the ones hpctl lays a run out under.
    assert (MODELS_PREFIX, DATASETS_PREFIX) == JOB_INPUT_PREFIXES
    assert (OUTPUTS_PREFIX, JOBS_PREFIX, COMPILE_CACHE_PREFIX) == JOB_OUTPUT_PREFIXES  # the cache: read and written


def test_both_lanes_have_the_cluster_and_the_job_role(synth_variant, synth):
    outputs = synth_variant.template["Outputs"]
    assert {StackOutput.CLUSTER_NAME, ROLE_OUTPUT, JobStackOutput.NEURON_IMAGE_URI} <= set(outputs)
    assert synth_variant.resources("AWS::SageMaker::Cluster")
    assert ROLE_OUTPUT not in synth.template["Outputs"]  # the default is the cluster lane alone


def test_lanes_is_validated():
    with pytest.raises(ConfigError, match="lanes"):
        HyperPodConfig.from_context({"lanes": "cloud"})


def test_jobs_only_snapshot(jobs_synth, request):
    check_snapshot(jobs_synth, request)


def test_jobs_only_lint_and_nag(jobs_synth):
    matches = lint_template(template_path(jobs_synth), ["us-west-2"])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []
    report = nag_report(jobs_synth)
    assert report["conclusion"] == "success" and report["violations"] == []


def test_hpctl_reads_the_accelerator_table_for_every_job_type():
    """The training-job-only rows are types CreateTrainingJob takes; hpctl's image family follows each row."""
    assert set(JOB_ONLY_INSTANCE_TYPES) <= set(training_instance_types())
    for instance_type, facts in JOB_INSTANCE_TYPES.items():
        assert accelerator(instance_type) == {"none": "cpu"}.get(facts.accelerator, facts.accelerator), instance_type
