"""The on-demand price of an instance hour, from the AWS Price List API (service AmazonSageMaker): the published
price, never a number kept here. Training jobs bill `<region>-Train:<type>`, HyperPod `<region>-Cluster:<type>`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import boto3
from botocore.exceptions import BotoCoreError, ClientError

PRICE_SOURCE = "AWS Price List API, AmazonSageMaker on-demand"
PRICING_REGION = "us-east-1"  # the Price List API's endpoint; it answers for every region


@dataclass(frozen=True)
class HourlyPrice:
    usd: float
    usage_type: str


def pricing_client(session: boto3.Session):
    return session.client("pricing", region_name=PRICING_REGION)


def hourly_price(pricing, instance_type: str, region: str, *, usage: str = "Train") -> HourlyPrice | None:
    """The on-demand price of one instance hour, or None when the price list has none (or cannot be reached).
    ``usage``: Train (training jobs, `<region>-Train:<type>`) or Cluster (HyperPod, `<region>-Cluster:<type>`)."""
    try:
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonSageMaker",
            Filters=[
                {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                {"Type": "CONTAINS", "Field": "usagetype", "Value": f"-{usage}:{instance_type}"},
            ],
        )
        items = [json.loads(item) for page in pages for item in page["PriceList"]]
    except (ClientError, BotoCoreError):
        return None
    # Not Spot-Train or ReservedCluster, not other sizes.
    exact = re.compile(rf"[A-Z0-9]+-{re.escape(usage)}:{re.escape(instance_type)}")
    for item in items:
        usage_type = item.get("product", {}).get("attributes", {}).get("usagetype", "")
        if not exact.fullmatch(usage_type):
            continue
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if dimension.get("unit", "").lower().startswith("hr") and usd:
                    return HourlyPrice(usd=float(usd), usage_type=usage_type)
    return None
