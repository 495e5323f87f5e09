"""Storage: the data bucket (sagemaker-*) and FSx for Lustre linked to its prefixes."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cluster_contract import DATASETS_FOLDER, OUTPUTS_FOLDER, PAYLOADS_FOLDER, s3_prefix
from stacks.checkov_skips import skip

AUTO_EVENTS = ("NEW", "CHANGED", "DELETED")


@dataclass(frozen=True)
class DataLink:
    """An FSx folder linked to the bucket prefix of the same name by a data repository association."""

    folder: str
    auto_import: bool
    auto_export: bool

    @property
    def s3_prefix(self) -> str:
        return s3_prefix(self.folder)

    @property
    def fsx_path(self) -> str:
        return f"/{self.folder}"


DATA_LINKS = (
    DataLink(PAYLOADS_FOLDER, auto_import=True, auto_export=False),
    DataLink(DATASETS_FOLDER, auto_import=True, auto_export=False),
    # Import and export: adapters and merged models land durably in S3.
    DataLink(OUTPUTS_FOLDER, auto_import=True, auto_export=True),
)


class DataBucket(Construct):
    """Holds lifecycle scripts, payloads, datasets and run outputs; access-logged, TLS-only.

    Destroy empties and deletes it unless ``retain`` (the user keeps the outputs).
    """

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str, retain: bool) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,  # a log entry overwritten or deleted stays recoverable for a week
            lifecycle_rules=[
                s3.LifecycleRule(expiration=Duration.days(90), noncurrent_version_expiration=Duration.days(7))
            ],
            removal_policy=removal,
            auto_delete_objects=not retain,
        )
        skip(
            self.access_logs.node.default_child,
            "CKV_AWS_18",
            "This bucket is the access-log target of the data bucket; logging it too would need another log "
            "bucket, which would need its own, without end. S3 writes these logs itself (no client access).",
        )
        # SSE-S3, not KMS: FSx's data repository service-linked role then needs no key policy.
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(30),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                ),
            ],
            removal_policy=removal,
            auto_delete_objects=not retain,
        )


class SharedFileSystem(Construct):
    """FSx for Lustre PERSISTENT_2 in the private subnet, its folders linked to the bucket.

    The file system waits for the security-group rules (its ENIs need them to pass FSx's
    network checks), and each repository association waits for the whole bucket construct,
    so on destroy the associations are gone before the bucket's objects are auto-deleted.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        security_group_rules: list[Construct],
        data_bucket: DataBucket,
        storage_capacity_gib: int,
        throughput_mibps_per_tib: int,
        compression: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_type="SSD",
            storage_capacity=storage_capacity_gib,
            subnet_ids=[subnet.subnet_id],
            security_group_ids=[security_group.security_group_id],
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type="PERSISTENT_2",
                per_unit_storage_throughput=throughput_mibps_per_tib,
                data_compression_type=compression,
                # A file system linked to S3 cannot be backed up; S3 (versioned) is the durable copy.
                automatic_backup_retention_days=0,
            ),
        )
        self.file_system.apply_removal_policy(RemovalPolicy.DESTROY)
        for rule in security_group_rules:
            self.file_system.node.add_dependency(rule)
        self.associations = [self._link(link, data_bucket) for link in DATA_LINKS]

    def _link(self, link: DataLink, data_bucket: DataBucket) -> fsx.CfnDataRepositoryAssociation:
        events = list(AUTO_EVENTS)
        association = fsx.CfnDataRepositoryAssociation(
            self,
            f"{link.folder.capitalize()}Link",
            file_system_id=self.file_system.ref,
            file_system_path=link.fsx_path,
            data_repository_path=f"s3://{data_bucket.bucket.bucket_name}/{link.s3_prefix}",
            batch_import_meta_data_on_create=link.auto_import,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=events)
                if link.auto_import
                else None,
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=events)
                if link.auto_export
                else None,
            ),
        )
        association.apply_removal_policy(RemovalPolicy.DESTROY)
        association.node.add_dependency(data_bucket)
        return association

    @property
    def dns_name(self) -> str:
        return self.file_system.attr_dns_name

    @property
    def mount_name(self) -> str:
        return self.file_system.attr_lustre_mount_name
