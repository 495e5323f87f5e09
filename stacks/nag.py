"""cdk-nag (3.x, CDK Validations API): register the AwsSolutions pack and record acknowledgments.

Every acknowledgment names one rule (IAM5 findings name their wildcard too) on the narrowest
construct that triggers it, with a reason specific to this app.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, DefaultStackSynthesizer, Stack, Validations
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def enable_checks(app: IConstruct) -> None:
    """Synth fails on any unacknowledged AwsSolutions finding (report: cdk.out/validation-report.json)."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


LAMBDA_BASIC_EXECUTION_ROLE = "arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
PLUGIN_PREFIX = "AwsSolutions::"  # how the Validations API names findings of the AwsSolutions plugin


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one AwsSolutions finding (e.g. ``AwsSolutions-IAM5[Resource::*]``) on ``scope`` and below."""
    Validations.of(scope).acknowledge(Acknowledgment(id=PLUGIN_PREFIX + rule_id, reason=reason))


# CDK's own custom-resource handlers, created once per stack at stack scope. Only what CDK itself
# generates is acknowledged here; the Lambda code and its runtime are maintained with aws-cdk-lib.
BUCKET_DEPLOYMENT_FINDINGS = {
    "AwsSolutions-L1": "The BucketDeployment handler's runtime is pinned by aws-cdk-lib (2.275.0 here) to the "
    "version its bundled AWS CLI layer supports; it moves with CDK upgrades, not in this app.",
    f"AwsSolutions-IAM4[Policy::{LAMBDA_BASIC_EXECUTION_ROLE}]": "The BucketDeployment handler only needs to write "
    "its own CloudWatch logs, which is exactly this AWS managed policy.",
    "AwsSolutions-IAM5[Action::s3:GetBucket*]": "CDK's grant for the BucketDeployment handler: it reads the CDK "
    "asset bucket to copy lifecycle/ and payloads/ zips.",
    "AwsSolutions-IAM5[Action::s3:GetObject*]": "CDK's grant for the BucketDeployment handler: it reads asset zips "
    "and the destination objects it syncs.",
    "AwsSolutions-IAM5[Action::s3:List*]": "CDK's grant for the BucketDeployment handler: `aws s3 sync` lists the "
    "asset and destination prefixes to compute the diff.",
    "AwsSolutions-IAM5[Action::s3:Abort*]": "CDK's grant for the BucketDeployment handler: aborting its own "
    "multipart uploads of large payload files.",
    "AwsSolutions-IAM5[Action::s3:DeleteObject*]": "CDK's grant for the BucketDeployment handler: prune deletes "
    "stale files under lifecycle/ and payloads/ only.",
}


def acknowledge_cdk_providers(stack: Stack, *, destination: s3.IBucket) -> None:
    """Acknowledge findings on CDK-generated handlers, each on the handler that causes it."""
    asset_bucket = f"cdk-{DefaultStackSynthesizer.DEFAULT_QUALIFIER}-assets-{stack.account}-{stack.region}"
    destination_id = stack.get_logical_id(destination.node.default_child)
    for child in stack.node.children:
        if child.node.id.startswith("Custom::CDKBucketDeployment"):
            for rule_id, reason in BUCKET_DEPLOYMENT_FINDINGS.items():
                acknowledge(child, rule_id, reason)
            acknowledge(
                child,
                f"AwsSolutions-IAM5[Resource::arn:{stack.partition}:s3:::{asset_bucket}/*]",
                "CDK's grant for the BucketDeployment handler: read the staged asset zips in the CDK "
                "bootstrap asset bucket of this account and region.",
            )
            acknowledge(
                child,
                f"AwsSolutions-IAM5[Resource::<{destination_id}.Arn>/*]",
                "CDK's grant for the BucketDeployment handler: write and prune objects in the data "
                "bucket (its lifecycle/ and payloads/ prefixes).",
            )
