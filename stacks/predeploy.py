"""`make deploy` runs this first: refuse config changes a live stack cannot take, before CloudFormation does.

    python -m stacks.predeploy [-c key=value ...]   (the same -c values the deploy gets)

With credentials it reads the deployed stack's template, whose Metadata records the config it was
made from, and refuses each changed key that stacks.update_safety marks forbidden, naming it and
what to do. A stack deployed before the config was recorded is compared resource by resource
instead (a synth, classified like the update-safety test). Without a stack it checks the bucket
name is free (a bucket kept by retain_outputs blocks the create). Without credentials it says so
and lets the deploy go on (it will ask for them).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from stacks.build import build_app
from stacks.config import ConfigError, HyperPodConfig
from stacks.update_safety import CONFIG_METADATA_KEY, FORBIDDEN, classify, config_record, refused_changes

REPO_ROOT = Path(__file__).resolve().parent.parent


def context_from(argv: Sequence[str], cdk_json: Path = REPO_ROOT / "cdk.json") -> dict[str, Any]:
    """cdk.json context with the command line's ``-c key=value`` / ``--context key=value`` on top."""
    context = dict(json.loads(cdk_json.read_text()).get("context", {}))
    words = list(argv)
    for index, word in enumerate(words):
        pair = None
        if word in ("-c", "--context") and index + 1 < len(words):
            pair = words[index + 1]
        elif word.startswith("--context="):
            pair = word.split("=", 1)[1]
        if pair and "=" in pair:
            key, value = pair.split("=", 1)
            context[key] = value
    return context


def resolve_account(config_context: Mapping[str, Any], session: boto3.Session) -> dict[str, str]:
    """`account: auto` means the credentials' account, as the CDK CLI resolves it."""
    if str(config_context.get("account", "auto")) != "auto":
        return {}
    identity = session.client("sts").get_caller_identity()
    return {"CDK_DEFAULT_ACCOUNT": identity["Account"]}


def deployed_template(session: boto3.Session, stack_name: str) -> dict[str, Any] | None:
    """The deployed stack's template; None when there is no stack to update."""
    cloudformation = session.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if "does not exist" in error.response.get("Error", {}).get("Message", ""):
            return None
        raise
    if stacks[0]["StackStatus"] == "ROLLBACK_COMPLETE":
        return None  # a failed first create: the CDK CLI deletes it and creates the stack afresh
    body = cloudformation.get_template(StackName=stack_name)["TemplateBody"]
    return body if isinstance(body, dict) else json.loads(body)


def template_refusals(deployed: Mapping[str, Any], context: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """Synthesize ``context`` and list the forbidden resource changes against the deployed template."""
    with tempfile.TemporaryDirectory() as outdir:
        app, stack = build_app(context, outdir=outdir, environ=environ)
        app.synth()
        wanted = json.loads((Path(outdir) / f"{stack.stack_name}.template.json").read_text())
    return [
        f"the deployed stack cannot take this change: {change.line()}"
        for change in classify(deployed, wanted)
        if change.action == FORBIDDEN
    ]


def bucket_exists(session: boto3.Session, bucket: str) -> bool:
    try:
        session.client("s3").head_bucket(Bucket=bucket)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise
    return True


def check(context: Mapping[str, Any], session: boto3.Session) -> list[str]:
    """What stands in the way of deploying ``context``; empty when nothing does."""
    environ = resolve_account(context, session)
    config = HyperPodConfig.from_context(context, environ=environ)
    deployed = deployed_template(session, config.stack_name)
    if deployed is None:
        if bucket_exists(session, config.bucket_name):
            return [
                f"bucket {config.bucket_name} already exists but stack {config.stack_name} does not (kept by "
                "retain_outputs when the stack was destroyed?): CloudFormation cannot create it again. Copy what "
                f"you need (aws s3 sync s3://{config.bucket_name}/outputs/ <somewhere>), then delete it "
                f"(aws s3 rb s3://{config.bucket_name} --force), or deploy under another name_prefix"
            ]
        return []
    recorded = deployed.get("Metadata", {}).get(CONFIG_METADATA_KEY)
    if recorded is None:  # deployed before the config was recorded: compare the resources themselves
        print("predeploy: the deployed stack records no config; comparing its resources", file=sys.stderr)
        return template_refusals(deployed, context, environ)
    return refused_changes(recorded, config_record(config))


def main(argv: Sequence[str] | None = None) -> int:
    context = context_from(sys.argv[1:] if argv is None else argv)
    try:
        region = HyperPodConfig.from_context(context, environ={}).region
        problems = check(context, boto3.Session(region_name=region))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except NoCredentialsError:
        print("note: no AWS credentials, so the deployed stack was not compared with this config", file=sys.stderr)
        return 0
    except (BotoCoreError, ClientError) as error:
        print(f"error: cannot compare with the deployed stack: {error}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print("predeploy: the deployed stack can take this config", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
