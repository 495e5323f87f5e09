"""The external Slurm accounting database (config key accounting_database = external): RDS for MySQL.

HyperPod's default keeps Slurm's accounting in a database on the controller, so a replaced controller
starts with no job history. With `external`, HyperPod's slurmdbd uses this instance instead
(Orchestrator.Slurm.AccountingDatabase: Endpoint, Port, Name, SecretArn; continuous provisioning only).
- The credentials are a secret RDS generates in Secrets Manager (user `slurm`, a random password,
  encrypted with a key of this construct). No password appears in the template, on a command line or in
  a file on the nodes but slurmdbd.conf, which HyperPod writes. Only the controller group's execution
  role may read the secret (its own role: stacks/stack.py).
- The database's security group admits MySQL (3306) only from the controller's security group, which this
  construct makes and the controller group alone carries beside the cluster's (OverrideVpcConfig,
  stacks/cluster.ControllerAccess): no login or compute node can reach the port.
- RDS needs a subnet group in two zones, and the network has one private subnet in one zone. This
  construct adds a subnet in accounting_database_zone_id, in the VPC range the network leaves free. It
  has no route out: the database needs none. The instance itself runs in the cluster's zone.
"""

from __future__ import annotations

import ipaddress

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from stacks.checkov_skips import skip
from stacks.log_encryption import encrypted_log_group
from stacks.nag import acknowledge
from stacks.secrets import secret_key

PORT = 3306  # MySQL's: HyperPod's default for the field, and the only port the security group opens
DATABASE_NAME = "slurm_acct_db"  # slurmdbd's schema, created by it (the secret's user may create schemas)
USER_NAME = "slurm"
# MySQL 8.4 (long-term support), pinned: a minor upgrade is a deploy that changes this line, not a surprise.
ENGINE = rds.DatabaseInstanceEngine.mysql(version=rds.MysqlEngineVersion.VER_8_4_9)
INSTANCE_TYPE = ec2.InstanceType.of(ec2.InstanceClass.BURSTABLE4_GRAVITON, ec2.InstanceSize.SMALL)
LOGS = ("error", "slowquery")  # exported to CloudWatch: /aws/rds/instance/<identifier>/<kind>
STORAGE_GIB = 20  # job records are small: a year of a busy cluster is well under a GiB


def database_subnet_cidr(vpc_cidr: str, zone_id: str) -> str:
    """A sixteenth of the VPC in its last quarter, which stacks/network.py leaves free (the private subnet has
    the first half, the public one the third quarter). Which sixteenth follows the zone's number, so a new
    zone gets a range of its own and its subnet can exist beside the old one while CloudFormation replaces it."""
    network = ipaddress.IPv4Network(vpc_cidr)
    last_quarter = list(network.subnets(new_prefix=network.prefixlen + 2))[3]
    slots = list(last_quarter.subnets(new_prefix=network.prefixlen + 4))
    return str(slots[int(zone_id.rsplit("az", 1)[1]) % len(slots)])


class AccountingDatabase(Construct):
    """RDS for MySQL for slurmdbd, its secret, its security group and its second subnet."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        vpc_cidr: str,
        cluster_subnet: ec2.ISubnet,
        second_zone_id: str,
        retain: bool,
        cluster_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        second = ec2.Subnet(
            self,
            "SecondZoneSubnet",
            vpc_id=vpc.vpc_id,
            cidr_block=database_subnet_cidr(vpc_cidr, second_zone_id),
            availability_zone=second_zone_id,  # replaced by the ID below, as in stacks/network.py
        )
        cfn_subnet = second.node.default_child
        cfn_subnet.add_property_deletion_override("AvailabilityZone")
        cfn_subnet.add_property_override("AvailabilityZoneId", second_zone_id)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Slurm accounting database: MySQL from the HyperPod controller security group only",
            allow_all_outbound=False,  # a database starts no connection
        )
        # Rules of its own it needs none: the cluster's group, which the controller carries too, lets it out.
        self.controller_security_group = ec2.SecurityGroup(
            self,
            "ControllerSecurityGroup",
            vpc=vpc,
            description="The HyperPod controller alone: the accounting database admits this group",
            allow_all_outbound=False,
        )
        ec2.CfnSecurityGroupIngress(
            self,
            "FromController",
            group_id=self.security_group.security_group_id,
            source_security_group_id=self.controller_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=PORT,
            to_port=PORT,
            description="slurmdbd on the HyperPod controller",
        )
        self.key = secret_key(self, "Encrypts the Slurm accounting database and its credentials")
        # Named, so that the log groups RDS writes to are the stack's own: destroy deletes them with it.
        identifier = f"{cluster_name}-slurm-accounting".lower()
        log_groups = [
            encrypted_log_group(self, f"{kind.title()}Logs", f"/aws/rds/instance/{identifier}/{kind}") for kind in LOGS
        ]
        self.instance = rds.DatabaseInstance(
            self,
            "Instance",
            instance_identifier=identifier,
            engine=ENGINE,
            instance_type=INSTANCE_TYPE,
            vpc=vpc,
            subnet_group=rds.SubnetGroup(
                self,
                "Subnets",
                vpc=vpc,
                description="The cluster's private subnet and one in a second zone (RDS needs two)",
                vpc_subnets=ec2.SubnetSelection(subnets=[cluster_subnet, second]),
            ),
            security_groups=[self.security_group],
            # In the controller's zone: the second subnet is there for RDS's two-zone rule only.
            availability_zone=cluster_subnet.node.default_child.attr_availability_zone,
            port=PORT,
            credentials=rds.Credentials.from_generated_secret(USER_NAME, encryption_key=self.key),
            storage_encrypted=True,
            storage_encryption_key=self.key,
            allocated_storage=STORAGE_GIB,
            storage_type=rds.StorageType.GP3,
            backup_retention=Duration.days(7),
            cloudwatch_logs_exports=list(LOGS),
            auto_minor_version_upgrade=False,  # pinned in ENGINE
            copy_tags_to_snapshot=True,
            deletion_protection=False,  # `cdk destroy` removes it (a snapshot first with retain_outputs)
            removal_policy=RemovalPolicy.SNAPSHOT if retain else RemovalPolicy.DESTROY,
            publicly_accessible=False,
        )
        for group in log_groups:
            self.instance.node.add_dependency(group)
        self._explain_exceptions()

    @property
    def secret_arn(self) -> str:
        assert self.instance.secret is not None  # from_generated_secret always makes one
        return self.instance.secret.secret_arn

    def cluster_property(self) -> sagemaker.CfnCluster.ClusterAccountingDatabaseProperty:
        """Orchestrator.Slurm.AccountingDatabase for the cluster."""
        return sagemaker.CfnCluster.ClusterAccountingDatabaseProperty(
            endpoint=self.instance.db_instance_endpoint_address,
            port=PORT,
            name=DATABASE_NAME,
            secret_arn=self.secret_arn,
        )

    def read_statements(self) -> list[iam.PolicyStatement]:
        """The controller's role reads the secret, and decrypts with its key only through Secrets Manager."""
        region = Stack.of(self).region
        return [
            iam.PolicyStatement(
                sid="ReadAccountingDatabaseSecret",
                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
                resources=[self.secret_arn],
            ),
            iam.PolicyStatement(
                sid="DecryptAccountingDatabaseSecret",
                actions=["kms:Decrypt"],
                resources=[self.key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{region}.amazonaws.com"}},
            ),
        ]

    def _explain_exceptions(self) -> None:
        """cdk-nag's and checkov's findings on the database that a fix would make worse, each with its reason."""
        acknowledge(self.instance, "AwsSolutions-RDS3", SINGLE_ZONE)
        acknowledge(self.instance, "AwsSolutions-RDS10", NO_DELETION_PROTECTION)
        acknowledge(self.instance, "AwsSolutions-RDS11", DEFAULT_PORT)
        acknowledge(self.instance.node.find_child("Secret"), "AwsSolutions-SMG4", NO_ROTATION)  # the generated one
        instance = self.instance.node.default_child
        skip(instance, "CKV_AWS_157", SINGLE_ZONE)
        skip(instance, "CKV_AWS_161", NO_IAM_AUTHENTICATION)
        skip(instance, "CKV_AWS_118", NO_ENHANCED_MONITORING)


SINGLE_ZONE = (
    "One instance in one zone: Slurm's accounting is not on the jobs' path (slurmctld keeps its records while "
    "slurmdbd cannot reach the database and sends them later), and a standby would double the cost."
)
NO_DELETION_PROTECTION = (
    "`cdk destroy` must leave nothing billable behind (docs/design: destroy); with retain_outputs the instance "
    "leaves a final snapshot instead."
)
DEFAULT_PORT = (
    "3306 is HyperPod's documented default for AccountingDatabase.Port; the security group admits it only from "
    "the controller's security group, so another port would hide nothing."
)
NO_ROTATION = (
    "HyperPod reads the password when it sets up slurmdbd on the controller; a rotation would lock slurmdbd out "
    "until the controller is provisioned again, so rotation is a manual step (docs/teams.md)."
)
NO_IAM_AUTHENTICATION = (
    "HyperPod's slurmdbd logs in with the user name and password of the secret named in AccountingDatabase.SecretArn; "
    "it has no IAM database authentication."
)
NO_ENHANCED_MONITORING = (
    "Enhanced monitoring adds a monitoring role and per-second OS metrics to a small database that slurmdbd writes a "
    "few rows to per job; CloudWatch's instance metrics and the exported error and slow-query logs cover it."
)
