"""What `make destroy` leaves behind, by design, and how to remove it (printed after destroy; the README lists it).

    python -m stacks.leftovers [-c key=value ...]   (the same -c values the deploy got)

The stack deletes everything it created (tests/infra/test_infra_deletion.py). What remains was
made by someone else (HyperPod, SageMaker, the CDK CLI) or kept on request (retain_outputs).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import boto3
from aws_cdk import DefaultStackSynthesizer
from botocore.exceptions import BotoCoreError, ClientError

from cluster_contract import JOB_LOG_GROUP
from stacks.config import HyperPodConfig, StackConfigError
from stacks.predeploy import context_from, resolve_account

QUALIFIER = DefaultStackSynthesizer.DEFAULT_QUALIFIER  # the CDK bootstrap's default (hnb659fds)


@dataclass(frozen=True)
class Leftover:
    name: str  # short, as the README's destroy list says it
    what: str  # the thing, named so it can be found
    why: str  # who made it, and why destroy keeps it
    remove: str  # a command that deletes it (read it before running it)


def left_after_destroy(config: HyperPodConfig) -> list[Leftover]:
    """Everything that outlives `make destroy` for this config."""
    account, region = config.account, config.region
    kept: list[Leftover] = []
    if config.cluster_lane:
        kept.append(
            Leftover(
                "HyperPod's cluster log groups",
                f"CloudWatch log groups /aws/sagemaker/Clusters/{config.cluster_name}/<cluster id>",
                "HyperPod creates them (one per cluster created); `hpctl logs lifecycle` reads them after a "
                "failed create, so they are not the stack's to delete",
                f"aws logs delete-log-group --region {region} --log-group-name /aws/sagemaker/Clusters/"
                f"{config.cluster_name}/<cluster id>",
            )
        )
    if config.jobs_lane:
        kept.append(
            Leftover(
                f"`{JOB_LOG_GROUP}`",
                f"CloudWatch log group {JOB_LOG_GROUP}",
                "SageMaker's own, shared by every training job of the account and region",
                f"aws logs delete-log-stream --region {region} --log-group-name {JOB_LOG_GROUP} "
                "--log-stream-name <job name>/algo-1-<time> (one per job host)",
            )
        )
    kept.append(
        Leftover(
            "asset zips in CDK's staging bucket",
            f"asset zips (lifecycle/, payloads/) in the CDK staging bucket cdk-{QUALIFIER}-assets-{account}-{region}",
            "`cdk deploy` stages them there, outside the stack; the bootstrap stack owns the bucket",
            f"aws s3 ls s3://cdk-{QUALIFIER}-assets-{account}-{region}/ (then aws s3 rm the zips of this app)",
        )
    )
    kept.append(
        Leftover(
            "images in CDK's ECR repository",
            f"training images in the CDK ECR repository cdk-{QUALIFIER}-container-assets-{account}-{region}",
            "`cdk deploy` pushes them there, outside the stack; the bootstrap stack owns the repository",
            f"aws ecr list-images --region {region} --repository-name cdk-{QUALIFIER}-container-assets-{account}-"
            f"{region} (then aws ecr batch-delete-image the tags of this app)",
        )
    )
    if config.retain_outputs:
        kept.append(
            Leftover(
                "the access-log bucket",
                f"bucket {config.bucket_name} with its objects, and the stack's access-log bucket",
                "retain_outputs=true keeps both (the access logs record who read the outputs)",
                f"aws s3 rb s3://{config.bucket_name} --force (and the access-log bucket named by "
                "`aws s3 ls | grep accesslogs`)",
            )
        )
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    context = context_from(sys.argv[1:] if argv is None else argv)
    try:
        region = HyperPodConfig.from_context(context, environ={}).region
        try:
            environ = resolve_account(context, boto3.Session(region_name=region))
        except (BotoCoreError, ClientError):
            environ = {}
            print("note: no AWS credentials: the account below is a stand-in for yours", file=sys.stderr)
        config = HyperPodConfig.from_context(context, environ=environ)
    except StackConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("Left after destroy (by design):")
    for item in left_after_destroy(config):
        print(f"- {item.what}: {item.why}.\n  remove: {item.remove}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
