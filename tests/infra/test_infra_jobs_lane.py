"""The jobs lane (cdk.json `lanes`): a jobs-only deploy has no VPC, FSx or cluster, only the bucket,
the images and a job execution role scoped to the bucket prefixes; synth, snapshot, cfn-lint, cdk-nag."""

from __future__ import annotations

import json

import pytest
from test_infra_lint_nag import nag_report, template_path
from test_infra_payload_change import rendered_deploy_facts
from test_infra_snapshot import check_snapshot

from cluster_contract import JOB_INPUT_PREFIXES, JOB_LOG_GROUP, JOB_OUTPUT_PREFIXES, JobStackOutput, StackOutput
from hpctl.jobs.job_instances import accelerator, training_instance_types
from hpctl.jobs.job_spec import COMPILE_CACHE_PREFIX, DATASETS_PREFIX, JOBS_PREFIX, MODELS_PREFIX, OUTPUTS_PREFIX
from hpctl.jobs.job_submit import IMAGE_OUTPUTS, ROLE_OUTPUT, JobDeployment
from llm_pipeline.jobs.deploy_facts import read_deploy_facts
from stacks.accelerators import JOB_INSTANCE_TYPES, JOB_ONLY_INSTANCE_TYPES
from stacks.config import HyperPodConfig, StackConfigError
from stacks.image import VARIANT_BUILD_ARG
from stacks.lint import lint_template

pytestmark = pytest.mark.xdist_group("infra")

JOBS_ONLY_TYPES = {
    "AWS::S3::Bucket",
    "AWS::S3::BucketPolicy",
    "Custom::S3AutoDeleteObjects",  # empties the bucket on destroy (retain_outputs = false)
    "AWS::Lambda::Function",  # its handler
    "AWS::Logs::LogGroup",  # the handler's log group
    "AWS::IAM::Role",
    "AWS::IAM::ManagedPolicy",  # the job role's permissions and boundary
    "AWS::SecretsManager::Secret",  # the Hugging Face token
    "AWS::SecretsManager::ResourcePolicy",  # only the job role reads it
    "AWS::KMS::Key",  # its key
}


def job_policy(synth) -> list[dict]:
    ((_, policy),) = [
        (key, res)
        for key, res in synth.resources("AWS::IAM::ManagedPolicy").items()
        if key.startswith("JobRoleJobAccess")
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
        {
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": jobs_synth.config.account}},
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
        }
    ]
    # One managed policy is the role's permissions and its boundary; no EC2 (the jobs use no VPC).
    ((policy_id, _),) = jobs_synth.resources("AWS::IAM::ManagedPolicy").items()
    assert role["Properties"]["ManagedPolicyArns"] == [{"Ref": policy_id}]
    assert role["Properties"]["PermissionsBoundary"] == {"Ref": policy_id}
    assert not [s for s in job_policy(jobs_synth) if "ec2:" in json.dumps(s["Action"])]
    statements = {s["Sid"]: s for s in job_policy(jobs_synth)}
    every = {f"{prefix}/*" for prefix in (*JOB_INPUT_PREFIXES, *JOB_OUTPUT_PREFIXES)}
    assert object_prefixes(statements["ReadJobFolders"]) == every
    assert object_prefixes(statements["WriteJobOutputs"]) == {f"{prefix}/*" for prefix in JOB_OUTPUT_PREFIXES}
    assert set(statements["ListJobPrefixes"]["Condition"]["StringLike"]["s3:prefix"]) == every
    assert JOB_LOG_GROUP in str(statements["TrainingJobLogGroup"]["Resource"])
    assert "log-stream:*" in str(statements["TrainingJobLogStreams"]["Resource"])
    assert "container-assets" in str(statements["PullTrainingImages"]["Resource"])


def test_outputs_are_what_hpctl_job_reads(jobs_synth):
    outputs = jobs_synth.template["Outputs"]
    assert set(outputs) == {
        ROLE_OUTPUT,
        JobStackOutput.NEURON_IMAGE_URI,
        StackOutput.BUCKET_NAME,
        StackOutput.REGION,
        StackOutput.HF_TOKEN_SECRET_ARN,
    }
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
    with pytest.raises(StackConfigError, match="lanes"):
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


def image_builds(synth) -> dict[str, tuple[str, str | None]]:
    """{image tag: (Dockerfile, DLC variant build argument)} of every image asset cdk-assets builds."""
    builds = {}
    for image in synth.training_images().values():
        (destination,) = image["destinations"].values()
        source = image["source"]
        builds[destination["imageTag"]] = (
            source["dockerFile"],
            source.get("dockerBuildArgs", {}).get(VARIANT_BUILD_ARG),
        )
    return builds


def resolved_outputs(synth) -> dict[str, str]:
    """The stack outputs as describe-stacks returns them (hpctl's input), the URL suffix filled in."""
    resolved = {}
    for key, output in synth.template["Outputs"].items():
        value = output["Value"]
        resolved[key] = value["Fn::Sub"].replace("${AWS::URLSuffix}", "amazonaws.com") if "Fn::Sub" in value else value
    return resolved


def built_from(synth, uri: str) -> tuple[str, str | None]:
    return image_builds(synth)[uri.rpartition(":")[2]]


def test_the_sagemaker_variant_is_built_only_for_a_jobs_lane_that_runs_cuda(
    named_synths, jobs_synth, jobs_gpu_synth, both_gpu_synth
):
    neuron, ec2, sagemaker = ("Dockerfile", None), ("Dockerfile.cuda", "ec2"), ("Dockerfile.cuda", "sagemaker")
    for cluster_only in named_synths.values():  # GPU groups, no jobs lane: the cluster's image alone
        assert ec2 in image_builds(cluster_only).values() and sagemaker not in image_builds(cluster_only).values()
    assert sorted(image_builds(jobs_synth).values()) == [neuron]  # a jobs lane without CUDA types
    assert sorted(image_builds(jobs_gpu_synth).values(), key=str) == sorted([neuron, sagemaker], key=str)
    # Both lanes: the Neuron image once for both, the CUDA image once per variant.
    assert sorted(image_builds(both_gpu_synth).values(), key=str) == sorted([neuron, ec2, sagemaker], key=str)
    for synth in (jobs_gpu_synth, both_gpu_synth):
        outputs = resolved_outputs(synth)
        assert built_from(synth, outputs[JobStackOutput.CUDA_IMAGE_URI]) == sagemaker
        assert built_from(synth, outputs[JobStackOutput.NEURON_IMAGE_URI]) == neuron
        assert "-sagemaker" in synth.template["Outputs"][JobStackOutput.CUDA_IMAGE_URI]["Description"]


def test_hpctl_job_submit_gives_cuda_and_cpu_types_the_sagemaker_variant(both_gpu_synth):
    """hpctl's own choice (JobDeployment.image_for) on the outputs of the real template."""
    deployment = JobDeployment(stack="HyperPodBothGpu", region="us-west-2", outputs=resolved_outputs(both_gpu_synth))
    chosen = {
        instance_type: built_from(both_gpu_synth, deployment.image_for(instance_type))
        for instance_type in ("ml.g5.12xlarge", "ml.p5.48xlarge", "ml.c5.xlarge", "ml.trn1.32xlarge")
    }
    assert chosen == {
        "ml.g5.12xlarge": ("Dockerfile.cuda", "sagemaker"),
        "ml.p5.48xlarge": ("Dockerfile.cuda", "sagemaker"),
        "ml.c5.xlarge": ("Dockerfile.cuda", "sagemaker"),  # a CPU type runs the CUDA image's torch
        "ml.trn1.32xlarge": ("Dockerfile", None),
    }


def test_the_cluster_partitions_keep_the_ec2_variant_beside_the_jobs_lane(both_gpu_synth, tmp_path):
    facts_folder = rendered_deploy_facts(both_gpu_synth, tmp_path)
    images = {
        partition: built_from(both_gpu_synth, read_deploy_facts(facts_folder, partition=partition)["HPL_IMAGE_URI"])
        for partition in ("trn1", "g5")
    }
    assert images == {"trn1": ("Dockerfile", None), "g5": ("Dockerfile.cuda", "ec2")}


def test_the_job_role_pulls_every_job_image(jobs_gpu_synth, both_gpu_synth):
    """One CDK assets repository holds every image; the role's pull grant is that repository."""
    for synth in (jobs_gpu_synth, both_gpu_synth):
        pull = {s["Sid"]: s for s in job_policy(synth)}["PullTrainingImages"]
        outputs = resolved_outputs(synth)
        for key in (JobStackOutput.CUDA_IMAGE_URI, JobStackOutput.NEURON_IMAGE_URI):
            repository = outputs[key].partition("/")[2].rpartition(":")[0]
            assert pull["Resource"].endswith(f":repository/{repository}"), (key, pull["Resource"])


def test_both_lanes_with_gpu_snapshot_lint_and_nag(both_gpu_synth, request):
    check_snapshot(both_gpu_synth, request)
    matches = lint_template(template_path(both_gpu_synth), ["us-west-2"])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []
    report = nag_report(both_gpu_synth)
    assert report["conclusion"] == "success" and report["violations"] == []
