"""The AWS Price List API as the hpctl tests answer it: a botocore Stubber on a real pricing client."""

from __future__ import annotations

import json

import boto3
from botocore.stub import Stubber


def price_item(usage_type: str, usd: str, region: str) -> str:
    """One Price List API product in the service's document shape (the figure is test data, not a price)."""
    dimension = {"unit": "Hrs", "pricePerUnit": {"USD": usd}}
    return json.dumps(
        {
            "product": {"attributes": {"usagetype": usage_type, "regionCode": region}},
            "terms": {"OnDemand": {"SKU.TERM": {"priceDimensions": {"SKU.TERM.RATE": dimension}}}},
        }
    )


def stubbed_pricing(items: list[str], *, usage_suffix: str, region: str):
    """A pricing client whose one GetProducts call must ask for ``usage_suffix`` in ``region``; answers ``items``."""
    client = boto3.Session(region_name=region).client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    expected = {
        "ServiceCode": "AmazonSageMaker",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "CONTAINS", "Field": "usagetype", "Value": usage_suffix},
        ],
    }
    stubber.add_response("get_products", {"PriceList": items, "FormatVersion": "aws_v1"}, expected)
    stubber.activate()
    return client
