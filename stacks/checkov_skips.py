"""checkov (the third template scanner, beside cfn-lint and cdk-nag): its skips, each on one resource with
a reason, written where checkov reads them (the resource's ``Metadata.checkov.skip``).

Only findings that a fix would make worse are skipped; tests/infra/test_infra_checkov.py runs checkov on
every app shape and fails on any finding not skipped here and on any skip that no longer fires.
"""

from __future__ import annotations

from aws_cdk import CfnResource, Stack
from constructs import IConstruct

METADATA_KEY = "checkov"
LAMBDA_FUNCTION = "AWS::Lambda::Function"
CDK_PROVIDER_PREFIX = "Custom::"
BUCKET_DEPLOYMENT_PREFIX = "Custom::CDKBucketDeployment"

# CDK's own custom-resource handlers (bucket auto-delete, default security group restriction, the payload
# upload): their code and settings come with aws-cdk-lib.
CDK_HANDLER_SKIPS = {
    "CKV_AWS_115": "A reserved concurrency on CDK's custom-resource handler would be carved out of the account's "
    "Lambda pool, and new accounts' pool of 10 leaves nothing to reserve: the deploy would fail. CloudFormation "
    "invokes it once per resource change, so it cannot run away.",
    "CKV_AWS_116": "CloudFormation is the only caller of CDK's custom-resource handler, and it learns of every "
    "failure (the handler answers FAILED, or the resource times out and rolls back); a dead-letter queue would "
    "hold events nobody replays.",
    "CKV_AWS_117": "CDK's custom-resource handler only calls AWS APIs (S3, EC2); inside the VPC it would need the "
    "NAT or endpoints, and the network interfaces Lambda keeps there would hold up `cdk destroy` of the VPC for "
    "many minutes.",
}
BUCKET_DEPLOYMENT_SKIPS = {
    "CKV_AWS_173": "The payload upload handler's environment holds no secret (CDK's asset and destination "
    "settings only); Lambda encrypts it at rest with its service key, and a key of ours would add a KMS grant "
    "to CDK's handler role for nothing.",
}


def skip(resource: CfnResource, check_id: str, reason: str) -> None:
    """Skip one checkov check on one resource, with its reason."""
    metadata = resource.cfn_options.metadata or {}
    entries = metadata.setdefault(METADATA_KEY, {}).setdefault("skip", [])
    entries.append({"id": check_id, "comment": reason})
    resource.cfn_options.metadata = metadata


def skip_cdk_handler_findings(stack: Stack) -> None:
    """The CDK handler skips, on each Lambda function CDK generated at stack scope (call last)."""
    for child in stack.node.children:
        if not child.node.id.startswith(CDK_PROVIDER_PREFIX):
            continue
        for function in _lambda_functions(child):
            for check_id, reason in CDK_HANDLER_SKIPS.items():
                skip(function, check_id, reason)
            if child.node.id.startswith(BUCKET_DEPLOYMENT_PREFIX):
                for check_id, reason in BUCKET_DEPLOYMENT_SKIPS.items():
                    skip(function, check_id, reason)


def _lambda_functions(construct: IConstruct) -> list[CfnResource]:
    return [
        c for c in construct.node.find_all() if isinstance(c, CfnResource) and c.cfn_resource_type == LAMBDA_FUNCTION
    ]
