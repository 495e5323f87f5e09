"""The rules of a compute group's AMI lifecycle keys: automatic patching (AutoPatchConfig) and scheduled AMI
updates (ScheduledUpdateConfig) of AWS::SageMaker::Cluster's instance groups (stacks/cluster.py writes them).

What CloudFormation accepts is read from cfn-lint's bundled schema for the type (the patching strategies, the
schedule's cron pattern), not retyped: the API also knows a DrainFirst strategy, which the schema does not, so
a template cannot ask for it.
"""

from __future__ import annotations

import functools
import re
from typing import Any

SCHEMA_REGION = "us-east-1"
# How an AMI change rolls through a group, in the API's DeploymentConfig shape (the template's and
# `hpctl update-software`'s): one node at a time, then 300 s for it to pass HyperPod's health checks and rejoin
# Slurm before the next, so the rest of the group keeps serving.
ROLLING_DEPLOYMENT = {
    "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
    "WaitIntervalInSeconds": 300,
}


@functools.cache
def _definitions() -> dict[str, Any]:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER  # only the config check needs cfn-lint's tables

    return PROVIDER_SCHEMA_MANAGER.get_resource_schema(SCHEMA_REGION, "AWS::SageMaker::Cluster").schema["definitions"]


def patching_strategies() -> tuple[str, ...]:
    """AutoPatchConfig.PatchingStrategy's values in the CloudFormation schema."""
    return tuple(_definitions()["AutoPatchConfig"]["properties"]["PatchingStrategy"]["enum"])


def schedule_pattern() -> re.Pattern[str]:
    """ScheduledUpdateConfig.ScheduleExpression's pattern in the CloudFormation schema."""
    return re.compile(_definitions()["ScheduledUpdateConfig"]["properties"]["ScheduleExpression"]["pattern"])
