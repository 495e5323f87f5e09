"""What AWS offers, read from the installed botocore data (never retyped here).

- HyperPod's instance types: the ClusterInstanceType enum of the SageMaker service model.
- Regions: those where the SageMaker API has an endpoint in botocore's endpoints data.
- Instance types per region: cfn-lint's table for AWS::SageMaker::Cluster, which cfn-lint generates from
  the AWS Price List (its ``update_specs_from_pricing``) and ships as REGIONAL_TABLE; regions it does not
  list are not checked. A type must be in both: HyperPod offers it, and the region prices it.
- Availability Zone IDs: their region prefix (``usw2`` for us-west-2), derived from the region name.
- CloudFormation resource types per region: the per-region provider schemas cfn-lint ships (a region
  without ``AWS::SageMaker::Cluster`` cannot deploy the cluster lane, whatever SageMaker offers there).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources

import botocore.loaders
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
from cfnlint.schema.manager import ResourceNotFoundError

# How zone IDs abbreviate the direction words of region names (us-west-2 -> usw2-az4).
DIRECTION_LETTERS = {
    "east": "e",
    "west": "w",
    "north": "n",
    "south": "s",
    "central": "c",
    "northeast": "ne",
    "northwest": "nw",
    "southeast": "se",
    "southwest": "sw",
    "gov": "g",
}
SAGEMAKER_ENDPOINT_SERVICE = "api.sagemaker"
CLUSTER_RESOURCE_TYPE = "AWS::SageMaker::Cluster"
PROVIDER_SCHEMAS = "cfn-lint's per-region CloudFormation provider schemas"
REGIONAL_TABLE_PACKAGE = "cfnlint.data.schemas.extensions.aws_sagemaker_cluster"
REGIONAL_TABLE_FILE = "instancetype_enum.json"
REGIONAL_TABLE = f"cfn-lint's {REGIONAL_TABLE_PACKAGE.replace('.', '/')}/{REGIONAL_TABLE_FILE}"


@functools.lru_cache(maxsize=1)
def _loader() -> botocore.loaders.Loader:
    return botocore.loaders.create_loader()


@functools.lru_cache(maxsize=1)
def hyperpod_instance_types() -> frozenset[str]:
    model = _loader().load_service_model("sagemaker", "service-2")
    return frozenset(model["shapes"]["ClusterInstanceType"]["enum"])


@functools.lru_cache(maxsize=1)
def sagemaker_regions() -> frozenset[str]:
    regions: set[str] = set()
    for partition in _loader().load_data("endpoints")["partitions"]:
        endpoints = partition["services"].get(SAGEMAKER_ENDPOINT_SERVICE, {}).get("endpoints", {})
        regions |= {name for name in endpoints if name in partition["regions"]}
    return frozenset(regions)


def partition_of(region: str) -> str:
    """The AWS partition (aws, aws-cn, aws-us-gov, ...) whose endpoints data lists ``region``; "" if none does."""
    for partition in _loader().load_data("endpoints")["partitions"]:
        if region in partition["regions"]:
            return partition["partition"]
    return ""


def zone_id_prefix(region: str) -> str | None:
    """``us-west-2`` -> ``usw2``, ``ap-southeast-1`` -> ``apse1``; None for a name of another shape."""
    match = re.fullmatch(r"([a-z]{2})((?:-[a-z]+)+)-(\d+)", region)
    if not match:
        return None
    words = match.group(2).strip("-").split("-")
    if not all(word in DIRECTION_LETTERS for word in words):
        return None
    return match.group(1) + "".join(DIRECTION_LETTERS[word] for word in words) + match.group(3)


@functools.lru_cache(maxsize=1)
def _regional_table() -> dict[str, frozenset[str]]:
    text = (resources.files(REGIONAL_TABLE_PACKAGE) / REGIONAL_TABLE_FILE).read_text()
    return {
        region: frozenset(entry["enum"])
        for region, entry in json.loads(text).items()
        if isinstance(entry, dict) and "enum" in entry
    }


def regional_instance_types(region: str) -> frozenset[str] | None:
    """The SageMaker cluster instance types priced in ``region``; None when the table has no such region."""
    return _regional_table().get(region)


SCHEMA_REFERENCE_REGION = "us-east-1"


@functools.cache
def _provider_types(region: str) -> str:
    """The region's resource-type table as cfn-lint ships it (type -> schema file), as text."""
    return (resources.files("cfnlint.data.schemas.providers") / f"{region}.json").read_text()


@functools.cache
def schema_published(region: str) -> bool:
    """Whether AWS publishes CloudFormation schemas for ``region``: cfn-lint ships a copy of us-east-1's
    table for the regions it has none of (the isolated partitions, eusc-de-east-1), which says nothing."""
    if region == SCHEMA_REFERENCE_REGION:
        return True
    try:
        return _provider_types(region) != _provider_types(SCHEMA_REFERENCE_REGION)
    except FileNotFoundError:
        return False


@functools.cache
def cloudformation_supports(region: str, resource_type: str) -> bool:
    """Whether CloudFormation in ``region`` has ``resource_type`` (cfn-lint's provider schema of that region;
    a region without a published schema has nothing we can vouch for)."""
    if not schema_published(region):
        return False
    try:
        PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type)
    except ResourceNotFoundError:
        return False
    return True


def cluster_regions() -> frozenset[str]:
    """SageMaker regions whose CloudFormation can create a HyperPod cluster."""
    return frozenset(region for region in sagemaker_regions() if cloudformation_supports(region, CLUSTER_RESOURCE_TYPE))
