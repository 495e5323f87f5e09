"""The jobs lane: the execution role SageMaker training jobs run as, scoped to this stack's bucket
prefixes, images and SageMaker's training-job log group.

The role holds only what our jobs use: hpctl's jobs name no VpcConfig, so it has none of the EC2
network-interface actions SageMaker needs for VPC-mode jobs. One customer-managed policy is both the
role's permissions and its permissions boundary, so nothing attached later widens it.

The sagemaker SDK's ModelTrainer checks the role before it creates a job (sagemaker 3.27.0,
``sagemaker.core.helper.iam_role_resolver.resolve_and_validate_role``; hpctl leaves the check on):
it simulates the training role type's actions whose policy resource is ``*`` (those EC2 actions
among them) with no resource and no request context, and reads the trust policy. An action denied
only implicitly while the permissions boundary does not allow it is one the SDK calls unverifiable
(``_is_unverifiable_denial``): it then logs a warning and goes on, while an explicit deny or a
trust policy without sagemaker.amazonaws.com still stops it. That is the route a role with a
boundary takes; what the role must hold is proven by tests/hpctl/test_hpctl_job.py against the
calls a job makes. cloudwatch:PutMetricData's namespace limit is written ``StringEqualsIfExists``:
PutMetricData always sends its namespace, so real calls stay limited to SageMaker's namespace.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cluster_contract import JOB_INPUT_PREFIXES, JOB_LOG_GROUP, JOB_OUTPUT_PREFIXES
from stacks.iam import SAGEMAKER_SERVICE, service_principal
from stacks.nag import acknowledge

METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"  # where SageMaker puts a job's metrics


class JobRole(Construct):
    """The role `hpctl job submit` names in CreateTrainingJob (stack output JobRoleArn)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        bucket: s3.IBucket,
        image_repository: ecr.IRepository,
        extra_statements: Sequence[iam.PolicyStatement] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            # The SageMaker SDK's own auto-created training role trusts SageMaker with this exact condition.
            assumed_by=service_principal(stack, SAGEMAKER_SERVICE),
            description=f"Execution role of the {name_prefix} SageMaker training jobs",
        )
        prefixes = (*JOB_INPUT_PREFIXES, *JOB_OUTPUT_PREFIXES)
        self.log_group_arn = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=JOB_LOG_GROUP,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        statements = [
            iam.PolicyStatement(
                sid="ListJobPrefixes",
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}/*" for prefix in prefixes]}},
            ),
            iam.PolicyStatement(
                sid="ReadJobFolders",
                actions=["s3:GetObject"],
                resources=[bucket.arn_for_objects(f"{prefix}/*") for prefix in prefixes],
            ),
            iam.PolicyStatement(
                sid="WriteJobOutputs",
                actions=["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[bucket.arn_for_objects(f"{prefix}/*") for prefix in JOB_OUTPUT_PREFIXES],
            ),
            iam.PolicyStatement(
                sid="PullTrainingImages",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                resources=[image_repository.repository_arn],
            ),
            iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
            # IAM authorizes the group's actions on the group and the stream writes on the streams.
            iam.PolicyStatement(
                sid="TrainingJobLogGroup",
                actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"],
                resources=[self.log_group_arn],
            ),
            iam.PolicyStatement(
                sid="TrainingJobLogStreams",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[f"{self.log_group_arn}:log-stream:*"],
            ),
            iam.PolicyStatement(
                sid="TrainingJobMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEqualsIfExists": {"cloudwatch:namespace": METRICS_NAMESPACE}},
            ),
            *extra_statements,  # e.g. reading the Hugging Face token's secret
        ]
        self.policy = iam.ManagedPolicy(
            self,
            "JobAccess",
            description=f"What the {name_prefix} training jobs may do: the permissions and the boundary of their role",
            statements=statements,
        )
        # Attached from the role's side (ManagedPolicyArns), as the boundary is: the policy names no role.
        self.role.add_managed_policy(self.policy)
        iam.PermissionsBoundary.of(self.role).apply(self.policy)
        self._acknowledge(bucket, prefixes)

    def _acknowledge(self, bucket: s3.IBucket, prefixes: tuple[str, ...]) -> None:
        bucket_id = Stack.of(self).get_logical_id(bucket.node.default_child)
        reasons = {
            "Resource::*": "ecr:GetAuthorizationToken has no resource-level permissions, and cloudwatch:PutMetricData "
            f"none either; the latter is limited to SageMaker's {METRICS_NAMESPACE} namespace by a condition.",
            f"Resource::{self.log_group_arn}:log-stream:*": "SageMaker writes one log stream per job and host "
            f"(<job name>/algo-<n>-<time>) in its {JOB_LOG_GROUP} group; names are only known at runtime.",
        }
        for prefix in prefixes:
            reasons[f"Resource::<{bucket_id}.Arn>/{prefix}/*"] = (
                f"Jobs read and write per-run folders under {prefix}/ of this stack's bucket "
                f"({prefix}/<run>/...); run names are chosen per run config."
            )
        for finding, reason in reasons.items():
            acknowledge(self.policy, f"AwsSolutions-IAM5[{finding}]", reason)
