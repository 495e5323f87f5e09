"""IAM: the execution roles HyperPod nodes run as, and the scaler's grant on the cluster.

One role (the node role) serves every group while the sides agree. Where they differ the controller gets
a role of its own (stacks/stack.py): with the external accounting database, only the controller may read
its secret. Which call each side makes, and that each grant here is needed by one: docs/aws-calls.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.checkov_skips import skip
from stacks.nag import acknowledge

MANAGED_INSTANCE_POLICY = "AmazonSageMakerClusterInstanceRolePolicy"
SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"


def service_principal(stack: Stack, service: str, *, key_documented: bool = True) -> iam.ServicePrincipal:
    """The service, acting for this account only: aws:SourceAccount guards the trust policy against a
    confused deputy (another account's cluster or job naming our role).

    ``key_documented=False`` where no AWS source shows the service sending the key when it assumes the
    role (the HyperPod cluster role): the IfExists form still refuses another account's request that
    carries it, and cannot refuse every request, as the plain form would if the key never came, which
    would fail CreateCluster on the first deploy.
    """
    operator = "StringEquals" if key_documented else "StringEqualsIfExists"
    return iam.ServicePrincipal(service, conditions={operator: {"aws:SourceAccount": stack.account}})


# Reads without resource-level permissions in EC2, so they can only be granted on "*".
ENI_READ_ACTIONS = [
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeDhcpOptions",
]
# Has resource types (network-interface and instance), but the instance is a HyperPod node that
# SageMaker runs outside this account, so its ARN cannot be written here: granted on "*".
ENI_DETACH_ACTION = "ec2:DetachNetworkInterface"
ENI_WRITE_ACTIONS = [
    "ec2:DeleteNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterfacePermission",
]
# The IAM service authorization reference for EC2 (as cfn-lint ships it, cfnlint/data/AdditionalSpecs/Policies.json)
# gives these ENI writes, and CreateTags, the network-interface resource alone, whose condition keys include
# ec2:Subnet and ec2:Vpc (each the ARN of the interface's subnet or VPC). So the ENI ids are unknown when the
# role is made, but every one of these writes is held to the cluster's own subnet and VPC.
# CreateNetworkInterface also authorizes the subnet and security-group resources, which carry no ec2:Subnet
# key: its condition sits on a statement of the interface alone. DetachNetworkInterface also authorizes the
# instance, a HyperPod node in SageMaker's account, so it stays on "*" without a condition (see ENI_DETACH_ACTION).
ENI_SCOPE_KEYS = ("ec2:Subnet", "ec2:Vpc")
BUCKET_WRITE_ACTIONS = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
# What the chain's scaler calls (payloads/llm_pipeline/jobs/capacity.HyperPodScaler), on this cluster alone.
SCALER_ACTIONS = ("sagemaker:ListClusterNodes", "sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes")


def scaler_grant(scope: Construct, construct_id: str, *, cluster_arn: str, roles: Sequence[iam.IRole]) -> iam.Policy:
    """The scaler's node APIs on the cluster's ARN, for the roles of the sides that run it: a chain claims
    nodes where it is submitted (the controller, a login node) and its release job gives them back on a compute
    node. A policy of its own, made after the cluster: the cluster waits for the roles' other policies, and this
    one names the cluster's ARN, which exists only once the cluster does."""
    return iam.Policy(
        scope,
        construct_id,
        statements=[iam.PolicyStatement(sid="ScaleThisCluster", actions=list(SCALER_ACTIONS), resources=[cluster_arn])],
        roles=list(roles),
    )


class ClusterRole(Construct):
    """The cluster's execution role and its policies, all children of this construct.

    The cluster depends on this whole construct, so CloudFormation creates every policy
    before CreateCluster (HyperPod checks the role's permissions as it provisions nodes).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        bucket: s3.IBucket,
        image_repository: ecr.IRepository,
        subnet: ec2.ISubnet,
        security_groups: Sequence[ec2.ISecurityGroup],
        vpc_id: str,
        extra_statements: Sequence[iam.PolicyStatement] = (),
        bucket_writes: bool = True,
        groups: str = "every group",
    ) -> None:
        """``bucket_writes=False``: the bucket is read only (the controller, whose steps write to FSx alone).
        ``groups``: the groups that run as this role, for its description."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=service_principal(stack, SAGEMAKER_SERVICE, key_documented=False),
            description=f"Execution role of the HyperPod cluster {cluster_name}: {groups}",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(MANAGED_INSTANCE_POLICY)],
        )
        eni_arn = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        subnet_arn = stack.format_arn(service="ec2", resource="subnet", resource_name=subnet.subnet_id)
        # Every group a node of this role carries: CreateNetworkInterface authorizes each one.
        group_arns = [
            stack.format_arn(service="ec2", resource="security-group", resource_name=group.security_group_id)
            for group in security_groups
        ]
        vpc_arn = stack.format_arn(service="ec2", resource="vpc", resource_name=vpc_id)
        in_cluster_network = {"StringEquals": dict(zip(ENI_SCOPE_KEYS, (subnet_arn, vpc_arn), strict=True))}
        log_group_arn = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/sagemaker/Clusters/{cluster_name}/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        statements = [
            iam.PolicyStatement(sid="VpcNetworkInterfaceReads", actions=ENI_READ_ACTIONS, resources=["*"]),
            iam.PolicyStatement(sid="DetachNodeInterfaces", actions=[ENI_DETACH_ACTION], resources=["*"]),
            iam.PolicyStatement(
                sid="CreateInterfacesInClusterSubnet",
                actions=["ec2:CreateNetworkInterface"],
                resources=[subnet_arn, *group_arns],
            ),
            iam.PolicyStatement(
                sid="CreateNodeInterfaces",
                actions=["ec2:CreateNetworkInterface"],
                resources=[eni_arn],
                conditions=in_cluster_network,
            ),
            iam.PolicyStatement(
                sid="ManageNodeInterfaces",
                actions=ENI_WRITE_ACTIONS,
                resources=[eni_arn],
                conditions=in_cluster_network,
            ),
            iam.PolicyStatement(
                sid="TagNodeInterfaces", actions=["ec2:CreateTags"], resources=[eni_arn], conditions=in_cluster_network
            ),
            iam.PolicyStatement(sid="ListDataBucket", actions=["s3:ListBucket"], resources=[bucket.bucket_arn]),
            iam.PolicyStatement(
                sid="ReadWriteDataBucket" if bucket_writes else "ReadDataBucket",
                actions=["s3:GetObject", *(BUCKET_WRITE_ACTIONS if bucket_writes else ())],
                resources=[bucket.arn_for_objects("*")],
            ),
            iam.PolicyStatement(
                sid="PullTrainingImage",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                resources=[image_repository.repository_arn],
            ),
            iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        ]
        # The cluster's log streams (HyperPod's node agent) are the managed policy's. It grants
        # DescribeLogStreams on streams too, but IAM authorizes that action on the log group: that one is ours.
        statements.append(
            iam.PolicyStatement(sid="ClusterLogStreams", actions=["logs:DescribeLogStreams"], resources=[log_group_arn])
        )
        statements.extend(extra_statements)  # e.g. remote write into the stack's metrics workspace
        self.policy = iam.Policy(self, "NodeAccess", statements=statements, roles=[self.role])
        skip(
            self.policy.node.default_child,
            "CKV_AWS_111",
            f"{ENI_DETACH_ACTION} is the only write here without a resource: its instance is a HyperPod node that "
            "SageMaker runs outside this account, so the ARN cannot be named (the same reason as cdk-nag IAM5's).",
        )
        self._acknowledge(eni_arn, log_group_arn, bucket)

    def _acknowledge(self, eni_arn: str, log_group_arn: str, bucket: s3.IBucket) -> None:
        bucket_logical_id = Stack.of(self).get_logical_id(bucket.node.default_child)
        acknowledge(
            self.role,
            f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{MANAGED_INSTANCE_POLICY}]",
            "HyperPod requires its managed instance policy on the node role; AWS maintains it as the "
            "service adds node agents (SSM, health monitoring, lifecycle reads from sagemaker-* buckets).",
        )
        wildcard_reasons = {
            "Resource::*": "EC2 Describe* and ecr:GetAuthorizationToken have no resource-level permissions, so "
            "'*' is their only resource. ec2:DetachNetworkInterface does have resource types (network-interface "
            "and instance), but the instance is a HyperPod node that SageMaker runs outside this account, so its "
            "ARN cannot be named in this policy.",
            f"Resource::{eni_arn}": "HyperPod creates one network interface per node in our subnet at "
            "provisioning time; their ids are unknown when the role is created, so every write on them is held to "
            "the cluster's subnet and VPC by the ec2:Subnet and ec2:Vpc condition keys instead.",
            f"Resource::<{bucket_logical_id}.Arn>/*": "Nodes read payloads and datasets and "
            "write run outputs anywhere under this one bucket (the cluster's own, named in the statement).",
            f"Resource::{log_group_arn}": "HyperPod creates one log group per CreateCluster call "
            "(/aws/sagemaker/Clusters/<name>/<cluster id>), scoped here to this cluster.",
        }
        for finding, reason in wildcard_reasons.items():
            acknowledge(self.policy, f"AwsSolutions-IAM5[{finding}]", reason)
