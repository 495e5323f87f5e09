"""Network: a one-AZ VPC for the cluster and FSx, and the security group they share.

The zone is given by its ID (usw2-az4), the same physical zone in every account, where zone names
(us-west-2d) are shuffled per account. CloudFormation takes the ID on each subnet; CDK's VPC only
knows zone names, from a per-account lookup that needs credentials, so the stack answers that
lookup itself with the ID (synth then works offline in any region) and the subnets carry it as
AvailabilityZoneId.
"""

from __future__ import annotations

import ipaddress

from aws_cdk import ContextProvider, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.log_encryption import encrypted_log_group

AVAILABILITY_ZONES_PROVIDER = "availability-zones"


def pin_availability_zone(stack: Stack, zone_id: str) -> None:
    """Answer the stack's zone lookup with ``zone_id`` (call before the stack has children)."""
    key = ContextProvider.get_key(stack, provider=AVAILABILITY_ZONES_PROVIDER).key
    stack.node.set_context(key, [zone_id])


class Network(Construct):
    """VPC with one public subnet (NAT) and one private subnet (nodes, FSx) in a single AZ.

    The private subnet takes half the VPC range: HyperPod gives each node several network
    interfaces (EFA included), so addresses go faster than the node count suggests.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cidr: str, availability_zone_id: str) -> None:
        super().__init__(scope, construct_id)
        prefix = ipaddress.IPv4Network(cidr).prefixlen
        flow_log_group = encrypted_log_group(self, "FlowLogGroup")
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            availability_zones=[availability_zone_id],  # see pin_availability_zone
            nat_gateways=1,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=prefix + 1
                ),
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=prefix + 2),
            ],
            # Cluster nodes reach the bucket (lifecycle scripts, DRAs' data path) without the NAT.
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            flow_logs={
                "AllTraffic": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        for subnet in (*self.vpc.private_subnets, *self.vpc.public_subnets):
            cfn_subnet = subnet.node.default_child
            cfn_subnet.add_property_deletion_override("AvailabilityZone")
            cfn_subnet.add_property_override("AvailabilityZoneId", availability_zone_id)
        self.private_subnet = self.vpc.private_subnets[0]
        self.security_group = ClusterSecurityGroup(self, "ClusterSecurityGroup", vpc=self.vpc)


class ClusterSecurityGroup(Construct):
    """Shared by the nodes and FSx: all traffic within the group, in and out, plus egress anywhere.

    The self-referencing rules are separate resources on purpose: EFA health checks need the
    self egress rule, and the L2 security group silently drops it when all outbound is allowed.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(scope, construct_id)
        self.group = ec2.SecurityGroup(
            self,
            "Group",
            vpc=vpc,
            description="HyperPod nodes and FSx for Lustre: all traffic within the group",
            # With no L2 egress rules CDK writes a match-nothing placeholder egress rule; that keeps
            # CloudFormation from adding its default allow-all rule, which the explicit
            # InternetEgress rule below would otherwise duplicate ("rule already exists").
            allow_all_outbound=False,
        )
        group_id = self.group.security_group_id
        self.self_ingress = ec2.CfnSecurityGroupIngress(
            self,
            "SelfIngress",
            group_id=group_id,
            source_security_group_id=group_id,
            ip_protocol="-1",
            description="All traffic from members of this group (Slurm, EFA, Lustre)",
        )
        self.self_egress = ec2.CfnSecurityGroupEgress(
            self,
            "SelfEgress",
            group_id=group_id,
            destination_security_group_id=group_id,
            ip_protocol="-1",
            description="All traffic to members of this group (EFA health checks need it)",
        )
        self.internet_egress = ec2.CfnSecurityGroupEgress(
            self,
            "InternetEgress",
            group_id=group_id,
            cidr_ip="0.0.0.0/0",
            ip_protocol="-1",
            description="Outbound through the NAT: ECR image pulls, model downloads, AWS APIs",
        )

    @property
    def rules(self) -> list[Construct]:
        """What FSx and the cluster wait for: the group is useless to them before its rules exist."""
        return [self.self_ingress, self.self_egress, self.internet_egress]
