"""`make deploy` runs this first: refuse changes a live stack cannot take, or that lose data, before
CloudFormation starts.

    python -m stacks.predeploy [-c key=value ...] [--allow-replace ID] [--allow-remove-group NAME]
                               [--allow-drop-cluster-lane] [--allow-controller-replace] [--allow-drop-metrics]
                               [--skip-online-checks]

With credentials it reads the deployed stack's template. Its Metadata records the config it was made
from: each changed key that stacks.update_safety marks forbidden is refused, and so are the changes
AWS refuses by value (FSx shrinking, a group's capacity type, the cluster's provisioning mode) and
those that delete data (a removed group, a dropped cluster lane, the metrics workspace) unless a flag
allows them. Then the app is synthesized and the deployed template compared resource by resource, as `cdk diff` marks
replacements (CloudFormation's create-only properties): a replaced or removed FSx file system,
bucket, cluster or VPC is refused unless ``--allow-replace`` names its logical id. That catches what
a code change between releases does too. Without a stack it checks the bucket name is free (a
bucket kept by retain_outputs blocks the create). Last, what only AWS knows (stacks/online_checks.py:
the zone ID, each training plan's zone, type and size, the cluster-usage quotas). Without
credentials it says so and lets the deploy go on (it will ask for them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from stacks.build import build_app
from stacks.config import HyperPodConfig, StackConfigError
from stacks.online_checks import online_refusals
from stacks.update_safety import (
    CONFIG_METADATA_KEY,
    NOTHING_ALLOWED,
    Allowances,
    classify,
    config_record,
    refused_changes,
    stateful_refusals,
    value_refusals,
)

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


def synthesize_template(context: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The template a deploy of ``context`` would send (the app synthesized into a temporary folder)."""
    print("predeploy: synthesizing the app to compare it with the deployed stack", file=sys.stderr)
    with tempfile.TemporaryDirectory() as outdir:
        app, stack = build_app(context, outdir=outdir, environ=environ)
        app.synth()
        return json.loads((Path(outdir) / f"{stack.stack_name}.template.json").read_text())


def template_refusals(
    deployed: Mapping[str, Any], wanted: Mapping[str, Any], allow: Allowances = NOTHING_ALLOWED
) -> list[str]:
    """Forbidden resource changes, and stateful resources replaced or removed without leave."""
    return stateful_refusals(classify(deployed, wanted), allow)


def zone_upgrade_refusals(recorded: Mapping[str, Any], config: HyperPodConfig, session: boto3.Session) -> list[str]:
    """A stack from the release that took a zone name (availability_zone) must keep that zone's ID."""
    name = recorded.get("availability_zone")
    if not isinstance(name, str) or "availability_zone_id" in recorded:
        return []
    zones = session.client("ec2").describe_availability_zones(ZoneNames=[name])["AvailabilityZones"]
    zone_id = zones[0]["ZoneId"] if zones else ""
    if zone_id == config.availability_zone_id:
        return []
    return [
        f"upgrade note: the deployed stack was made by a release that took a zone name (availability_zone = "
        f"{name!r}); in this account that zone is {zone_id!r}, but config key 'availability_zone_id' is "
        f"{config.availability_zone_id!r}, which would replace the subnets, FSx (its data) and the cluster. Set "
        f"availability_zone_id to {zone_id!r} (cdk.json or -c availability_zone_id={zone_id})"
    ]


# A fact about HyperPod, recorded in cdk.json's context (or -c) once measured on a real cluster: does
# BatchDeleteClusterNodes lower a group's target count in continuous mode? docs/deploy.md gives the commands
# that answer it. Not a config key (the stack does not change with it); absent, the answer is unknown.
DELETE_FACT_KEY = "fact:batch_delete_lowers_target_count"
FACT_VALUES = {"true": True, "false": False}


def delete_lowers_target(context: Mapping[str, Any]) -> bool | None:
    """The recorded answer: True, False, or None (not recorded: unknown)."""
    value = context.get(DELETE_FACT_KEY)
    if value is None:
        return None
    answer = FACT_VALUES.get(str(value).lower())
    if answer is None:
        raise StackConfigError(f"context key '{DELETE_FACT_KEY}' has value {value!r}; allowed: true or false")
    return answer


def scaling_refusals(config: HyperPodConfig, session: boto3.Session, *, delete_lowers: bool | None = None) -> list[str]:
    """A group that scales with runs, while chains hold nodes above its floor: refuse the deploy.

    The template's InstanceCount of such a group is its floor and never moves with the scaling
    (stacks/compute_groups.ComputeGroup.deployed_count), so a deploy finds no drift once the chains have given
    their nodes back. While they hold some, the group is above the floor, and an update of the cluster would
    send the floor back to HyperPod and take claimed nodes from running chains.

    Which count says the chains hold nodes follows ``delete_lowers`` (:data:`DELETE_FACT_KEY`). True: the
    target count (DescribeCluster's TargetCount), which the release's deletes lower. False: the deletes leave
    the target raised, so the nodes that run now (CurrentCount) are the chains'; a target above them is what
    the releases left, and this deploy's InstanceCount puts it back to the floor. Unknown: the target count,
    the safe reading (it may refuse a deploy no chain stands in the way of), and the refusal says how to tell."""
    scaled = {group.name: group for group in config.compute_groups if group.scale_with_runs}
    if not scaled or not config.cluster_lane:
        return []
    try:
        described = session.client("sagemaker").describe_cluster(ClusterName=config.cluster_name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ValidationException"):
            return []  # no cluster yet: nothing is claimed
        raise
    counted = "CurrentCount" if delete_lowers is False else "TargetCount"
    problems = []
    for live in described.get("InstanceGroups", []):
        group = scaled.get(live.get("InstanceGroupName", ""))
        held = live.get(counted, 0)
        if group is not None and held > group.deployed_count:
            unknown = (
                f" (counted by its target count: whether BatchDeleteClusterNodes lowers it is not recorded; "
                f"docs/deploy.md says how to find out and record {DELETE_FACT_KEY})"
                if delete_lowers is None
                else ""
            )
            problems.append(
                f"config key 'compute_groups' group {group.name!r} scales with runs and holds {held} nodes, above "
                f"its floor {group.deployed_count} (min_instance_count){unknown}: chains have claimed them, and a "
                "deploy now would hand HyperPod the floor and take their nodes; deploy when the chains have ended "
                "(`hpctl status` shows the claims), or cancel them (scancel) and let their release jobs give the "
                "nodes back"
            )
    return problems


def bucket_exists(session: boto3.Session, bucket: str) -> bool:
    try:
        session.client("s3").head_bucket(Bucket=bucket)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise
    return True


def check(
    context: Mapping[str, Any],
    session: boto3.Session,
    *,
    allow: Allowances = NOTHING_ALLOWED,
    wanted_template: Mapping[str, Any] | None = None,
) -> list[str]:
    """What stands in the way of deploying ``context``; empty when nothing does.

    ``wanted_template`` is the synthesized template when the caller has it (tests); else the app is
    synthesized here.
    """
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
    if recorded is None:  # deployed before the config was recorded: only the resources can tell
        print("predeploy: the deployed stack records no config; comparing its resources", file=sys.stderr)
    else:
        wanted_record = config_record(config)
        problems = [
            *refused_changes(recorded, wanted_record),
            *value_refusals(recorded, wanted_record, allow),
            *zone_upgrade_refusals(recorded, config, session),
            *scaling_refusals(config, session, delete_lowers=delete_lowers_target(context)),
        ]
        if problems:  # each names its key; the resource comparison would only repeat them
            return problems
    wanted = wanted_template if wanted_template is not None else synthesize_template(context, environ)
    return template_refusals(deployed, wanted, allow)


def parse_arguments(argv: Sequence[str]) -> tuple[dict[str, Any], Allowances, bool]:
    """The context (cdk.json with -c on top), what the flags allow, and whether to run the online
    checks (stacks/online_checks.py); other words are the deploy's own."""
    parser = argparse.ArgumentParser(
        prog="python -m stacks.predeploy",
        description="Refuse a deploy the deployed stack cannot take or that loses data; "
        "other words (-c key=value) are the deploy's own.",
    )
    parser.add_argument("--allow-replace", action="append", default=[], metavar="LOGICAL_ID")
    parser.add_argument("--allow-remove-group", action="append", default=[], metavar="NAME")
    parser.add_argument("--allow-drop-cluster-lane", action="store_true")
    parser.add_argument("--allow-controller-replace", action="store_true")
    parser.add_argument("--allow-drop-metrics", action="store_true")
    parser.add_argument("--skip-online-checks", action="store_true")
    flags, rest = parser.parse_known_args(list(argv))
    allow = Allowances(
        replace=tuple(flags.allow_replace),
        remove_groups=tuple(flags.allow_remove_group),
        drop_cluster_lane=flags.allow_drop_cluster_lane,
        replace_controller=flags.allow_controller_replace,
        drop_metrics=flags.allow_drop_metrics,
    )
    return context_from(rest), allow, not flags.skip_online_checks


def main(argv: Sequence[str] | None = None) -> int:
    context, allow, online = parse_arguments(sys.argv[1:] if argv is None else argv)
    try:
        region = HyperPodConfig.from_context(context, environ={}).region
        session = boto3.Session(region_name=region)
        problems = check(context, session, allow=allow)
        if online:
            config = HyperPodConfig.from_context(context, environ=resolve_account(context, session))
            problems += online_refusals(config, session)
    except StackConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except NoCredentialsError:
        print(
            "note: no AWS credentials, so the deployed stack was not compared with this config and the online "
            "checks (zone ID, zone offerings, training plans, service quotas) were skipped",
            file=sys.stderr,
        )
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
