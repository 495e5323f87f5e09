"""The cluster facts file the stack uploads next to the lifecycle script (the nodes' HPL_* values).

hpctl reads it for the few node-side values it needs (payloads folder, login user), so those are
never retyped here; the contract's defaults apply only when an older deploy lacks the file.
"""

from __future__ import annotations

import json
import sys

import boto3
from botocore.exceptions import ClientError

from cluster_contract import CLUSTER_FACTS_KEY as FACTS_KEY
from cluster_contract import DEFAULT_USER, OUTPUTS_FOLDER, PAYLOADS_FOLDER, fsx_dir
from hpctl.common.errors import HpctlError, aws_errors

# What the stack writes for these keys; used only when an older deploy lacks the facts file.
CONTRACT_DEFAULTS = {
    "payloads_dir": fsx_dir(PAYLOADS_FOLDER),
    "default_user": DEFAULT_USER,
    "outputs_dir": fsx_dir(OUTPUTS_FOLDER),
}


def read_cluster_facts(session: boto3.Session, bucket: str) -> dict:
    s3 = session.client("s3")
    with aws_errors(f"read s3://{bucket}/{FACTS_KEY}"):
        try:
            body = s3.get_object(Bucket=bucket, Key=FACTS_KEY)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            print(f"note: s3://{bucket}/{FACTS_KEY} not found; using the default node paths", file=sys.stderr)
            return dict(CONTRACT_DEFAULTS)
    try:
        facts = json.loads(body)
    except json.JSONDecodeError as error:
        raise HpctlError(f"s3://{bucket}/{FACTS_KEY} is not valid JSON ({error}): redeploy the stack") from error
    return {**CONTRACT_DEFAULTS, **facts}
