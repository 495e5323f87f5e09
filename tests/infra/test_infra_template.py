"""What the synthesized template creates: network, storage, image, IAM, uploads, cluster, outputs."""

from __future__ import annotations

import ipaddress
import json

import pytest

from cluster_contract import CONTROLLER_GROUP, FSX_MOUNT_PATH, LOGIN_GROUP, ObservabilityOutput, StackOutput
from stacks.config import COMPUTE_GROUP, LIFECYCLE_SCRIPT

pytestmark = pytest.mark.xdist_group("infra")

OUTPUT_IDS = [name for name in StackOutput.names() if name != StackOutput.HF_TOKEN_SECRET_ARN]


def getatt(logical_id: str, attribute: str) -> dict:
    return {"Fn::GetAtt": [logical_id, attribute]}


def ref(logical_id: str) -> dict:
    return {"Ref": logical_id}


def test_vpc_has_one_public_and_one_private_subnet_in_the_configured_zone(synth):
    _, vpc = synth.one("AWS::EC2::VPC")
    assert vpc["Properties"]["CidrBlock"] == synth.config.vpc_cidr
    subnets = synth.resources("AWS::EC2::Subnet").values()
    assert [s["Properties"]["AvailabilityZoneId"] for s in subnets] == [synth.config.availability_zone_id] * 2
    assert all("AvailabilityZone" not in s["Properties"] for s in subnets), "IDs, not account-specific names"
    assert sorted(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets) == [False, True]
    network = ipaddress.ip_network(synth.config.vpc_cidr)
    assert all(ipaddress.ip_network(s["Properties"]["CidrBlock"]).subnet_of(network) for s in subnets)
    for kind in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::FlowLog"):
        synth.one(kind)
    assert synth.one("AWS::EC2::FlowLog")[1]["Properties"]["TrafficType"] == "ALL"
    _, endpoint = synth.one("AWS::EC2::VPCEndpoint")
    assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
    assert endpoint["Properties"]["ServiceName"]["Fn::Join"][1][-1] == ".s3"


def test_security_group_allows_all_traffic_to_and_from_itself_as_explicit_rules(synth):
    group_id, group = synth.one("AWS::EC2::SecurityGroup")
    self_ref = getatt(group_id, "GroupId")
    ingress = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupIngress").values()]
    egress = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupEgress").values()]
    assert {"GroupId": self_ref, "SourceSecurityGroupId": self_ref, "IpProtocol": "-1"}.items() <= ingress[0].items()
    assert any(
        {"GroupId": self_ref, "DestinationSecurityGroupId": self_ref, "IpProtocol": "-1"}.items() <= rule.items()
        for rule in egress
    )
    assert not group["Properties"].get("SecurityGroupIngress"), "no inline ingress: only the self rule"


def test_bucket_is_named_for_sagemaker_private_encrypted_versioned_logged_and_tls_only(synth):
    bucket_id = synth.logical_id(synth.stack.data.bucket.node.default_child)
    props = synth.template["Resources"][bucket_id]["Properties"]
    assert props["BucketName"] == synth.config.bucket_name and props["BucketName"].startswith("sagemaker-")
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    logs_id = synth.logical_id(synth.stack.data.access_logs.node.default_child)
    assert props["LoggingConfiguration"]["DestinationBucketName"] == ref(logs_id)
    policies = [
        p["Properties"]
        for p in synth.resources("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == ref(bucket_id)
    ]
    statements = policies[0]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
    )


def test_fsx_is_persistent_2_lustre_2_15_lz4_in_the_private_subnet_after_the_group_rules(synth):
    _, fs = synth.one("AWS::FSx::FileSystem")
    props = fs["Properties"]
    assert (props["FileSystemType"], props["FileSystemTypeVersion"], props["StorageCapacity"]) == (
        "LUSTRE",
        "2.15",
        1200,
    )
    lustre = props["LustreConfiguration"]
    assert (lustre["DeploymentType"], lustre["DataCompressionType"]) == ("PERSISTENT_2", "LZ4")
    assert lustre["PerUnitStorageThroughput"] == synth.config.fsx_throughput_mibps_per_tib
    private = synth.logical_id(synth.stack.network.private_subnet.node.default_child)
    assert props["SubnetIds"] == [ref(private)]
    rules = set(synth.resources("AWS::EC2::SecurityGroupIngress")) | set(
        synth.resources("AWS::EC2::SecurityGroupEgress")
    )
    assert rules <= set(fs["DependsOn"])


def test_repository_links_import_payloads_and_datasets_and_sync_outputs_both_ways(synth):
    fs_id, _ = synth.one("AWS::FSx::FileSystem")
    bucket_id = synth.logical_id(synth.stack.data.bucket.node.default_child)
    links = {}
    for link in synth.resources("AWS::FSx::DataRepositoryAssociation").values():
        props = link["Properties"]
        assert props["FileSystemId"] == ref(fs_id)
        assert bucket_id in link["DependsOn"], "the bucket (and its auto-delete) goes only after the link"
        assert props["DataRepositoryPath"] == {
            "Fn::Join": ["", ["s3://", ref(bucket_id), f"{props['FileSystemPath']}/"]]
        }
        links[props["FileSystemPath"]] = sorted(props["S3"])
    assert links == {
        "/payloads": ["AutoImportPolicy"],
        "/datasets": ["AutoImportPolicy"],
        "/outputs": ["AutoExportPolicy", "AutoImportPolicy"],
    }


def test_training_image_is_an_asset_from_payloads_dockerfile(synth):
    images = synth.training_images()
    assert len(images) == 1
    (image,) = images.values()
    assert image["source"]["dockerFile"] == "Dockerfile" and image["source"]["platform"] == "linux/amd64"
    staged = synth.outdir / image["source"]["directory"]
    assert (staged / "Dockerfile").is_file()
    assert not (staged / "llm_pipeline").exists(), "payload code stays out of the image build context"


def test_cluster_role_is_for_sagemaker_with_the_managed_policy_and_scoped_access(synth):
    role_id = synth.logical_id(synth.stack.role.role.node.default_child)
    role = synth.template["Resources"][role_id]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {
            "Action": "sts:AssumeRole",
            # IfExists: no AWS source shows HyperPod sending the key (stacks/iam.service_principal)
            "Condition": {"StringEqualsIfExists": {"aws:SourceAccount": synth.config.account}},
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
        }
    ]
    assert json.dumps(role["ManagedPolicyArns"]).count("AmazonSageMakerClusterInstanceRolePolicy") == 1
    policy_id = synth.logical_id(synth.stack.role.policy.node.default_child)
    policy = synth.template["Resources"][policy_id]["Properties"]
    assert policy["Roles"] == [ref(role_id)]
    by_sid = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert "ec2:CreateNetworkInterface" in json.dumps(by_sid["CreateNodeInterfaces"])
    assert "ec2:DescribeNetworkInterfaces" in by_sid["VpcNetworkInterfaceReads"]["Action"]
    bucket_id = synth.logical_id(synth.stack.data.bucket.node.default_child)
    assert by_sid["ListDataBucket"]["Resource"] == getatt(bucket_id, "Arn")
    assert by_sid["ReadWriteDataBucket"]["Resource"] == {"Fn::Join": ["", [getatt(bucket_id, "Arn"), "/*"]]}
    assert "ClusterLogs" not in by_sid  # the managed policy grants the cluster's logs (docs/aws-calls.md)


def test_role_can_pull_exactly_the_training_image_repository(synth):
    (image,) = synth.training_images().values()
    (destination,) = image["destinations"].values()
    policy_id = synth.logical_id(synth.stack.role.policy.node.default_child)
    statements = synth.template["Resources"][policy_id]["Properties"]["PolicyDocument"]["Statement"]
    pull = next(s for s in statements if s["Sid"] == "PullTrainingImage")
    assert sorted(pull["Action"]) == [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
    ]
    assert pull["Resource"].endswith(f":repository/{destination['repositoryName']}")
    assert destination["imageTag"] in json.dumps(synth.template["Outputs"]["ImageUri"])


def test_cluster_is_api_driven_slurm_with_controller_and_trainium_compute(synth):
    _, cluster = synth.one("AWS::SageMaker::Cluster")
    props = cluster["Properties"]
    config = synth.config
    assert props["ClusterName"] == config.cluster_name
    # Continuous provisioning by default: it runs slurm.conf in merge mode and refuses a strategy.
    assert props["NodeProvisioningMode"] == "Continuous"
    assert props["Orchestrator"] == {"Slurm": {}}
    assert props["NodeRecovery"] == "Automatic"
    groups = {g["InstanceGroupName"]: g for g in props["InstanceGroups"]}
    assert list(groups) == [CONTROLLER_GROUP, COMPUTE_GROUP]
    controller, compute = groups[CONTROLLER_GROUP], groups[COMPUTE_GROUP]
    assert controller["SlurmConfig"] == {"NodeType": "Controller"}
    assert (controller["InstanceType"], controller["InstanceCount"]) == ("ml.c5.xlarge", 1)
    (default,) = config.compute_groups
    assert compute["SlurmConfig"] == {"NodeType": "Compute", "PartitionNames": [default.partition]}
    assert (compute["InstanceType"], compute["InstanceCount"], compute["ThreadsPerCore"]) == ("ml.trn1.32xlarge", 1, 1)
    assert {"EbsVolumeConfig": {"VolumeSizeInGB": default.ebs_volume_gb}} in compute["InstanceStorageConfigs"]
    # On-demand, no plan, no deep health checks: the properties stay out of the default template.
    assert not {"CapacityRequirements", "TrainingPlanArn", "OnStartDeepHealthChecks"} & set(compute)
    fs_id, _ = synth.one("AWS::FSx::FileSystem")
    fsx = {
        "FsxLustreConfig": {
            "DnsName": getatt(fs_id, "DNSName"),
            "MountName": getatt(fs_id, "LustreMountName"),
            "MountPath": FSX_MOUNT_PATH,
        }
    }
    for group in groups.values():
        assert fsx in group["InstanceStorageConfigs"]
        assert group["LifeCycleConfig"] == {
            "SourceS3Uri": f"s3://{config.bucket_name}/lifecycle/",
            "OnInitComplete": LIFECYCLE_SCRIPT,
        }
        assert group["ExecutionRole"] == getatt(synth.logical_id(synth.stack.role.role.node.default_child), "Arn")
    assert props["VpcConfig"]["Subnets"] == [
        ref(synth.logical_id(synth.stack.network.private_subnet.node.default_child))
    ]


def test_cluster_waits_for_lifecycle_upload_role_policies_links_and_nat(synth):
    _, cluster = synth.one("AWS::SageMaker::Cluster")
    depends = set(cluster["DependsOn"])
    stack = synth.stack
    must_exist_first = (
        synth.cfn_ids_under(stack.lifecycle, "Custom::CDKBucketDeployment")
        | synth.cfn_ids_under(stack.role)
        | synth.cfn_ids_under(stack.file_system, "AWS::FSx::DataRepositoryAssociation")
        | {synth.logical_id(stack.network.private_subnet.node.find_child("DefaultRoute"))}
    )
    assert len(must_exist_first) == 7
    assert must_exist_first <= depends


def test_variant_with_login_group_and_overrides(synth_variant):
    _, cluster = synth_variant.one("AWS::SageMaker::Cluster")
    groups = {g["InstanceGroupName"]: g for g in cluster["Properties"]["InstanceGroups"]}
    assert list(groups) == [CONTROLLER_GROUP, LOGIN_GROUP, COMPUTE_GROUP]
    assert groups[LOGIN_GROUP]["SlurmConfig"] == {"NodeType": "Login"}
    assert (groups[COMPUTE_GROUP]["InstanceType"], groups[COMPUTE_GROUP]["InstanceCount"]) == ("ml.trn1n.32xlarge", 2)
    assert cluster["Properties"]["Orchestrator"]["Slurm"]["SlurmConfigStrategy"] == "Overwrite"
    assert "NodeProvisioningMode" not in cluster["Properties"]  # provisioning = standard
    assert synth_variant.one("AWS::FSx::FileSystem")[1]["Properties"]["StorageCapacity"] == 2400
    assert synth_variant.template["Outputs"]["Region"]["Value"] == "us-east-1"


def test_outputs_have_the_contract_ids_and_next_commands(synth):
    outputs = synth.template["Outputs"]
    assert list(outputs) == [
        *OUTPUT_IDS,
        ObservabilityOutput.MODE,
        ObservabilityOutput.METRICS_ENDPOINT,
        StackOutput.HF_TOKEN_SECRET_ARN,  # both lanes: after the lane's own
    ]
    config = synth.config
    assert outputs["ClusterName"]["Value"] == config.cluster_name
    assert outputs["ControllerGroup"]["Value"] == CONTROLLER_GROUP and outputs["ComputeGroup"]["Value"] == COMPUTE_GROUP
    cluster_id, _ = synth.one("AWS::SageMaker::Cluster")
    assert outputs["ClusterId"]["Value"] == {"Fn::Select": [1, {"Fn::Split": ["/", getatt(cluster_id, "ClusterArn")]}]}
    shell = json.dumps(outputs["ShellCommand"]["Value"])
    assert "hpctl shell" in shell and "aws ssm start-session" in shell and "sagemaker-cluster:" in shell
    assert f"_{CONTROLLER_GROUP}-<instance-id>" in shell
    assert outputs["SubmitCommand"]["Value"].startswith("hpctl submit ")


def instance_groups(synth) -> dict[str, dict]:
    _, cluster = synth.one("AWS::SageMaker::Cluster")
    return {g["InstanceGroupName"]: g for g in cluster["Properties"]["InstanceGroups"]}


def test_gpu_only_config_is_four_spot_p5_nodes_with_only_the_cuda_image(named_synths):
    synth = named_synths["gpu-only"]
    groups = instance_groups(synth)
    assert list(groups) == [CONTROLLER_GROUP, "gpu"]
    gpu = groups["gpu"]
    assert (gpu["InstanceType"], gpu["InstanceCount"], gpu["SlurmConfig"]["PartitionNames"]) == (
        "ml.p5.48xlarge",
        4,
        ["p5"],
    )
    assert gpu["CapacityRequirements"] == {"Spot": {}}
    assert "TrainingPlanArn" not in gpu
    (image,) = synth.training_images().values()
    assert image["source"]["dockerFile"] == "Dockerfile.cuda"
    staged = synth.outdir / image["source"]["directory"]
    assert sorted(p.name for p in staged.iterdir()) == [
        ".dockerignore",
        "Dockerfile.cuda",
        "image",
        "requirements-gpu.txt",
    ]
    assert synth.template["Outputs"]["ComputeGroup"]["Value"] == "gpu"
    assert "on GPU" in synth.template["Description"]


def test_mixed_config_has_both_groups_both_images_and_the_training_plan(named_synths):
    synth = named_synths["mixed"]
    groups = instance_groups(synth)
    assert list(groups) == [CONTROLLER_GROUP, "trn", "gpu"]
    trn, gpu = groups["trn"], groups["gpu"]
    assert (trn["InstanceType"], trn["SlurmConfig"]["PartitionNames"]) == ("ml.trn1.32xlarge", ["trn1"])
    assert not {"CapacityRequirements", "TrainingPlanArn"} & set(trn)
    assert gpu["TrainingPlanArn"] == "arn:aws:sagemaker:us-west-2:123456789012:training-plan/g5-reserved"
    assert "CapacityRequirements" not in gpu  # the plan's reserved capacity
    assert gpu["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]
    dockerfiles = sorted(i["source"]["dockerFile"] for i in synth.training_images().values())
    assert dockerfiles == ["Dockerfile", "Dockerfile.cuda"]
    assert synth.template["Outputs"]["ComputeGroup"]["Value"] == "trn,gpu"
