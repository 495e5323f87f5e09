"""Region, zone and instance-type checks come from botocore's data, and synth needs no lookup anywhere."""

from __future__ import annotations

import json
import re

import pytest
from test_infra_lint_nag import template_path

from stacks.accelerators import INSTANCE_TYPES, REFUSED_INSTANCE_TYPES
from stacks.aws_catalog import (
    cluster_regions,
    hyperpod_instance_types,
    partition_of,
    regional_instance_types,
    sagemaker_regions,
    zone_id_prefix,
)
from stacks.config import HyperPodConfig, StackConfigError
from stacks.lint import lint_template

pytestmark = pytest.mark.xdist_group("infra")


def parse(**context: object) -> HyperPodConfig:
    return HyperPodConfig.from_context(context, environ={})


def test_every_instance_type_of_the_accelerator_table_is_one_hyperpod_offers():
    offered = hyperpod_instance_types()
    assert "ml.trn1.32xlarge" in offered and "ml.trn1.2xlarge" not in offered
    assert sorted(set(INSTANCE_TYPES) - offered) == []
    assert sorted(set(REFUSED_INSTANCE_TYPES) - offered) == []  # a refusal names a real type, not a typo


def test_zone_id_prefixes_follow_the_region_names():
    assert {r: zone_id_prefix(r) for r in ("us-west-2", "ap-southeast-1", "eu-central-1", "us-gov-west-1")} == {
        "us-west-2": "usw2",
        "ap-southeast-1": "apse1",
        "eu-central-1": "euc1",
        "us-gov-west-1": "usgw1",
    }
    assert {"us-west-2", "us-east-1", "eu-north-1"} <= sagemaker_regions()


def test_a_zone_name_is_refused_with_the_way_to_its_id():
    with pytest.raises(StackConfigError, match=r"'availability_zone' was replaced by 'availability_zone_id'.*ZoneId"):
        parse(availability_zone="us-west-2d")


def test_a_well_formed_unknown_region_names_the_key():
    with pytest.raises(StackConfigError, match=r"config key 'region' has value 'ma-rs-1'; allowed: a region where"):
        parse(region="ma-rs-1", availability_zone_id="mars1-az1")


def test_synth_needs_no_lookup_in_a_region_cdk_json_never_cached(synthesize_from, source_root):
    """No `missing` context in the cloud assembly: the CLI would otherwise need credentials to look it up."""
    synth = synthesize_from(source_root, region="eu-north-1", availability_zone_id="eun1-az2")
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert "missing" not in manifest
    subnets = synth.resources("AWS::EC2::Subnet").values()
    assert {s["Properties"]["AvailabilityZoneId"] for s in subnets} == {"eun1-az2"}


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"compute_groups": json.dumps([{"name": "c", "instance_type": "ml.trn2.48xlarge", "partition": "t"}])},
            "group [0] (c), key 'instance_type' has value 'ml.trn2.48xlarge'; allowed: a type offered in us-west-2",
        ),
        (
            {"region": "ap-northeast-2", "availability_zone_id": "apne2-az1"},
            "key 'instance_type' has value 'ml.trn1.32xlarge'; allowed: a type offered in ap-northeast-2",
        ),
        (
            {
                "login_instance_count": 1,
                "login_instance_type": "ml.g5.12xlarge",
                "region": "us-west-1",
                "availability_zone_id": "usw1-az1",
                "compute_groups": json.dumps([{"name": "c", "instance_type": "ml.c5.xlarge", "partition": "cpu"}]),
            },
            "config key 'login_instance_type' has value 'ml.g5.12xlarge'; allowed: a type offered in us-west-1",
        ),
    ],
)
def test_instance_types_are_checked_against_the_regions_table(context, message):
    with pytest.raises(StackConfigError, match=re.escape(message)) as caught:
        parse(**context)
    assert "instancetype_enum.json" in str(caught.value), "the error names the table's source"


def test_the_regional_table_is_read_from_the_installed_cfn_lint():
    oregon = regional_instance_types("us-west-2")
    assert oregon and "ml.trn1.32xlarge" in oregon and "ml.c5.xlarge" in oregon
    assert regional_instance_types("ma-rs-1") is None


def test_a_region_whose_cloudformation_has_no_hyperpod_cluster_is_refused_naming_region():
    """18 SageMaker regions (eu-west-3, GovCloud, China, ...) have no AWS::SageMaker::Cluster resource."""
    without = sagemaker_regions() - cluster_regions()
    assert {"eu-west-3", "us-gov-west-1", "cn-north-1"} <= without and "us-west-2" not in without
    with pytest.raises(StackConfigError) as caught:
        parse(region="eu-west-3", availability_zone_id="euw3-az1")
    message = str(caught.value)
    assert message.startswith("config key 'region' has value 'eu-west-3'; allowed: a region whose CloudFormation has")
    assert "AWS::SageMaker::Cluster" in message and "eu-west-1" in message and "lanes = jobs" in message
    assert parse(region="eu-west-3", availability_zone_id="euw3-az1", lanes="jobs").region == "eu-west-3"


@pytest.mark.parametrize(("region", "zone", "partition"), [("cn-north-1", "cnn1-az1", "aws-cn")])
def test_the_jobs_lane_synthesizes_in_another_partition_with_its_arns(
    synthesize_from, source_root, region, zone, partition
):
    """No hard-coded arn:aws: the acknowledged asset-bucket ARN and every other one use the stack's partition."""
    assert partition_of(region) == partition
    synth = synthesize_from(source_root, region=region, availability_zone_id=zone, lanes="jobs")
    text = json.dumps(synth.template)
    assert "arn:aws:" not in text
    assert lint_template(template_path(synth), [region]) == []
