"""The Hugging Face token from the stack's Secrets Manager secret, read when a step needs it.

The deploy hands each node (and each training job) the secret's ARN as HPL_HF_TOKEN_SECRET_ARN, a plain
fact; `hpctl secret set hf-token` put the token in it. This module reads the token with the node's or
the job's role and returns it to the caller, which passes it to huggingface_hub in this process: it is
never set in the environment (child processes and /proc/<pid>/environ would see it), written to a file,
or printed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from llm_pipeline.errors import StepError

SECRET_ARN_VARIABLE = "HPL_HF_TOKEN_SECRET_ARN"  # cluster_contract.HUB_TOKEN_SECRET_VARIABLE
TOKEN_FIELD = "token"  # cluster_contract.HUB_TOKEN_FIELD
SET_HINT = "set it from your machine with `hpctl secret set hf-token`"


def secret_arn(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(SECRET_ARN_VARIABLE, "").strip()


def read_token(arn: str) -> str | None:
    """The token in the secret, or None while it has not been set; a StepError naming the secret when
    it cannot be read (no boto3, no permission, no network)."""
    region = arn.split(":")[3] if arn.count(":") >= 6 else None  # arn:aws:secretsmanager:<region>:<account>:secret:…
    try:
        import boto3  # in the training images (AWS's DLC and Neuron bases); imported only when a token is needed

        reply = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=arn)
    except Exception as error:  # ImportError, botocore's ClientError and connection errors: all say the same
        raise StepError(f"cannot read the Hugging Face token from {arn}: {type(error).__name__}: {error}") from None
    try:
        token = json.loads(reply.get("SecretString") or "{}").get(TOKEN_FIELD, "")
    except (ValueError, AttributeError):
        raise StepError(f"{arn} does not hold the JSON hpctl writes: {SET_HINT}") from None
    if not isinstance(token, str) or not token.strip():
        return None
    return token.strip()
