"""The jobs lane: the execution role SageMaker training jobs run as, scoped to this stack's bucket
prefixes, images and SageMaker's training-job log group.

The sagemaker SDK's ModelTrainer checks the role before it creates a job (sagemaker 3.27.0,
``sagemaker.core.helper.iam_role_resolver``): when the person submitting may call
iam:SimulatePrincipalPolicy, it simulates the training role type's actions whose policy resource
is ``*`` (ecr:GetAuthorizationToken, cloudwatch:PutMetricData and the EC2 network-interface
actions SageMaker needs for VPC-mode jobs) with no resource and no request context, and refuses the
role on any denial. So those actions are granted on ``*`` here, and the metrics namespace limit is
written ``StringEqualsIfExists``: PutMetricData always sends its namespace, so real calls stay
limited to SageMaker's namespace, while the context-free simulation passes.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cluster_contract import JOB_INPUT_PREFIXES, JOB_LOG_GROUP, JOB_OUTPUT_PREFIXES
from stacks.nag import acknowledge

METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"  # where SageMaker puts a job's metrics
# What SageMaker does for a job that runs in a customer VPC (VpcConfig): it creates, shares and
# deletes the job's network interfaces as this role. hpctl's jobs name no VpcConfig, but the SDK's
# role check requires these of every training role (see the module docstring).
VPC_MODE_ACTIONS = [
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
]


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
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
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
            iam.PolicyStatement(
                sid="TrainingJobLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[self.log_group_arn, f"{self.log_group_arn}:log-stream:*"],
            ),
            iam.PolicyStatement(
                sid="TrainingJobMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEqualsIfExists": {"cloudwatch:namespace": METRICS_NAMESPACE}},
            ),
            iam.PolicyStatement(sid="VpcModeNetworkInterfaces", actions=VPC_MODE_ACTIONS, resources=["*"]),
        ]
        self.policy = iam.Policy(self, "JobAccess", statements=statements, roles=[self.role])
        self._acknowledge(bucket, prefixes)

    def _acknowledge(self, bucket: s3.IBucket, prefixes: tuple[str, ...]) -> None:
        bucket_id = Stack.of(self).get_logical_id(bucket.node.default_child)
        reasons = {
            "Resource::*": "ecr:GetAuthorizationToken has no resource-level permissions, and cloudwatch:PutMetricData "
            f"none either; the latter is limited to SageMaker's {METRICS_NAMESPACE} namespace by a condition. "
            "The EC2 network-interface actions are what SageMaker needs for a job in a customer VPC, whose "
            "interfaces and VPC are unknown here; the sagemaker SDK refuses a training role without them on '*'.",
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
