"""hpctl doctor: everything a deploy needs that can be checked before it starts, one OK/FAIL line each.

The AWS checks read the account as the deploy will see it: the credentials (STS), the configured region
and cdk.json config (the stack's own validation), the cluster-usage quotas of the configured instance
types (Service Quotas, as predeploy reads them), the zone's offerings of those types (EC2's offerings
of the type without its ``ml.`` prefix, the closest public signal of capacity) and the CDK bootstrap
stack. The local checks run the tools the deploy runs, found on PATH: Docker and Node.js. Last, the
Hugging Face token the download step reads (its presence only; it is never printed): a local one, or the
deployed stack's secret once `hpctl secret set hf-token` filled it (DescribeSecret: the stack's own filler
version has been moved to AWSPREVIOUS by a later PutSecretValue; the value itself is never read, and the
secret's policy lets only the run roles read it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3

from cluster_contract import JSII_NODE_MAJORS, StackOutput, node_verdict
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.stack import describe_stack
from llm_pipeline.download import TOKEN_VARIABLES, find_token
from stacks.aws_catalog import sagemaker_regions
from stacks.config import HyperPodConfig, StackConfigError
from stacks.online_checks import (
    CLUSTER_QUOTA_SUFFIX,
    EC2_TYPE_PREFIX,
    cluster_quotas,
    quota_increase_hint,
    quota_wanted,
    zones_offering,
)

CDK_TOOLKIT_STACK = "CDKToolkit"  # the CDK CLI's default bootstrap stack name (cdk.json sets no other)
# aws-cdk-lib's DefaultStackSynthesizer refuses a bootstrap older than this (its MIN_BOOTSTRAP_STACK_VERSION).
MIN_BOOTSTRAP_VERSION = 6
TOOL_TIMEOUT_S = 30
BOOTSTRAP_FIX = "run `npx --no-install cdk bootstrap` once for this account and region (docs/deploy.md)"


@dataclass(frozen=True)
class Finding:
    ok: bool
    check: str
    detail: str  # what was found, or for a FAIL what is wrong and the fix
    checked: bool = True  # False: skipped because an earlier check failed (a SKIP line, no failure of its own)

    def line(self) -> str:
        return f"{'OK' if self.ok else 'FAIL' if self.checked else 'SKIP':<4}  {self.check}: {self.detail}"


def passed(check: str, detail: str) -> Finding:
    return Finding(ok=True, check=check, detail=detail)


def failed(check: str, detail: str) -> Finding:
    return Finding(ok=False, check=check, detail=detail)


def not_checked(check: str, detail: str) -> Finding:
    return Finding(ok=False, check=check, detail=detail, checked=False)


def aws_check(check: str, doing: str, probe: Callable[[], list[Finding]]) -> list[Finding]:
    """Run an AWS probe; a botocore failure becomes one FAIL line with hpctl's usual message."""
    try:
        with aws_errors(doing):
            return probe()
    except HpctlError as error:
        return [failed(check, str(error))]


def credentials(session: boto3.Session) -> list[Finding]:
    def probe() -> list[Finding]:
        identity = session.client("sts").get_caller_identity()
        return [passed("credentials", f"account {identity['Account']} as {identity['Arn']}")]

    return aws_check("credentials", "check the credentials (sts GetCallerIdentity)", probe)


def region(name: str) -> list[Finding]:
    if name in sagemaker_regions():
        return [passed("region", f"{name} has a SageMaker endpoint")]
    return [
        failed(
            "region",
            f"{name!r} is not a region where SageMaker has an endpoint: set `region` in cdk.json (or --region) "
            "to one, e.g. us-west-2",
        )
    ]


def quotas(config: HyperPodConfig, session: boto3.Session) -> list[Finding]:
    def probe() -> list[Finding]:
        found = cluster_quotas(session)
        findings = []
        for instance_type, count in sorted(quota_wanted(config).items()):
            check = f"quota {instance_type}{CLUSTER_QUOTA_SUFFIX}"
            quota = found.get(instance_type)
            if quota is None:
                findings.append(passed(check, f"{count} wanted; no applied value listed, the default applies"))
            elif count > quota:
                findings.append(
                    failed(check, f"{count} wanted, quota {quota:g}: ask for more ({quota_increase_hint()})")
                )
            else:
                findings.append(passed(check, f"{count} wanted, quota {quota:g}"))
        return findings

    return aws_check("quotas", "read the SageMaker quotas (service-quotas ListServiceQuotas)", probe)


def zone_offerings(config: HyperPodConfig, session: boto3.Session) -> list[Finding]:
    types = sorted({config.controller_instance_type, *(group.instance_type for group in config.compute_groups)})
    if config.login_instance_count:
        types = sorted({*types, config.login_instance_type})
    zone = config.availability_zone_id

    def probe() -> list[Finding]:
        zones = zones_offering(session, types)
        findings = []
        for instance_type in types:
            check = f"zone {zone} offers {instance_type}"
            ec2_type = instance_type.removeprefix(EC2_TYPE_PREFIX)
            if zone in zones[instance_type]:
                findings.append(passed(check, f"EC2 offers {ec2_type} there"))
            elif zones[instance_type]:
                findings.append(
                    failed(
                        check,
                        f"EC2 offers {ec2_type} only in {', '.join(sorted(zones[instance_type]))}: set "
                        "availability_zone_id in cdk.json to one of them",
                    )
                )
            else:
                findings.append(
                    failed(check, f"EC2 offers {ec2_type} in no zone of {config.region}: pick another region")
                )
        return findings

    return aws_check("zone offerings", "read the zone offerings (ec2 DescribeInstanceTypeOfferings)", probe)


def cdk_bootstrap(session: boto3.Session) -> list[Finding]:
    check = "CDK bootstrap"

    def probe() -> list[Finding]:
        cloudformation = session.client("cloudformation")
        try:
            stack = cloudformation.describe_stacks(StackName=CDK_TOOLKIT_STACK)["Stacks"][0]
        except cloudformation.exceptions.ClientError as error:
            if "does not exist" not in error.response.get("Error", {}).get("Message", ""):
                raise
            return [failed(check, f"no {CDK_TOOLKIT_STACK} stack in {session.region_name}: {BOOTSTRAP_FIX}")]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        version = outputs.get("BootstrapVersion", "")
        if not version.isdigit() or int(version) < MIN_BOOTSTRAP_VERSION:
            return [
                failed(
                    check,
                    f"{CDK_TOOLKIT_STACK} has bootstrap version {version or 'none'} ({stack['StackStatus']}), "
                    f"the CDK needs {MIN_BOOTSTRAP_VERSION} or later: {BOOTSTRAP_FIX}",
                )
            ]
        return [passed(check, f"{CDK_TOOLKIT_STACK} version {version} ({stack['StackStatus']})")]

    return aws_check(check, f"read the {CDK_TOOLKIT_STACK} stack (cloudformation DescribeStacks)", probe)


def run_tool(words: list[str], environ: Mapping[str, str]) -> subprocess.CompletedProcess[str] | None:
    """The tool run from PATH as the deploy runs it; None when PATH has no such program."""
    program = shutil.which(words[0], path=environ.get("PATH", ""))
    if program is None:
        return None
    try:
        return subprocess.run(
            [program, *words[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, env=dict(environ)
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(words, returncode=124, stdout="", stderr=f"no answer in {TOOL_TIMEOUT_S} s")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def docker(environ: Mapping[str, str]) -> list[Finding]:
    done = run_tool(["docker", "info"], environ)
    if done is None:
        return [
            failed(
                "Docker", "no `docker` on PATH: install Docker; make deploy builds the training image (docs/image.md)"
            )
        ]
    if done.returncode != 0:
        said = last_line(done.stderr) or last_line(done.stdout)
        return [
            failed(
                "Docker",
                f"`docker info` exited {done.returncode} ({said}): start the Docker daemon, or add your user to the "
                "docker group",
            )
        ]
    return [passed("Docker", "`docker info` answers")]


def node(environ: Mapping[str, str]) -> list[Finding]:
    wanted = " or ".join(str(major) for major in JSII_NODE_MAJORS)
    done = run_tool(["node", "--version"], environ)
    if done is None:
        return [failed("Node.js", f"no `node` on PATH: install Node.js {wanted} (the CDK CLI runs on it)")]
    match = re.match(r"v?(\d+)\.", done.stdout.strip())
    if done.returncode != 0 or not match:
        return [failed("Node.js", f"`node --version` said {last_line(done.stdout + done.stderr)!r}: reinstall Node.js")]
    runs, note = node_verdict(int(match.group(1)))
    if not runs:
        return [failed("Node.js", f"{done.stdout.strip()} found: {note}")]
    return [passed("Node.js", f"{done.stdout.strip()}: {note}" if note else done.stdout.strip())]


# The stage Secrets Manager gives a secret's earlier version once a new one is put (the stack's filler, here).
REPLACED_STAGE = "AWSPREVIOUS"


def stack_token_secret(session: boto3.Session, stack_name: str) -> str:
    """The deployed stack's token secret when `hpctl secret set hf-token` has filled it, else ""."""
    arn = describe_stack(session, stack_name).output(StackOutput.HF_TOKEN_SECRET_ARN)
    if not arn:
        return ""
    with aws_errors(f"describe the secret {arn}"):
        stages = session.client("secretsmanager").describe_secret(SecretId=arn).get("VersionIdsToStages", {})
    return arn if any(REPLACED_STAGE in names for names in stages.values()) else ""


def hugging_face_token(
    environ: Mapping[str, str], session: boto3.Session | None = None, stack_name: str = ""
) -> list[Finding]:
    """A local token, else the stack's filled secret (with a session and a stack name to look it up)."""
    check = "Hugging Face token"
    if any(environ.get(name, "").strip() for name in TOKEN_VARIABLES):
        return [passed(check, f"{' or '.join(TOKEN_VARIABLES)} is set (not shown)")]
    if find_token(environ):
        return [passed(check, "the file `huggingface-cli login` wrote is there (not shown)")]
    if session is not None and stack_name:
        try:
            arn = stack_token_secret(session, stack_name)
        except HpctlError:  # no stack yet, or not readable: the local token is what counts then
            arn = ""
        if arn:
            return [passed(check, f"the stack's secret {arn} is set (`hpctl secret set hf-token`; not read here)")]
    return [
        failed(
            check,
            "none found: gated models (the default Llama 3 8B) need one; accept the model's licence first, then "
            "store it in the stack once deployed (`hpctl secret set hf-token`, docs/deploy.md), or set HF_TOKEN "
            "for local runs",
        )
    ]


def findings(*, context: Mapping[str, Any], session: boto3.Session, environ: Mapping[str, str]) -> list[Finding]:
    """Every check in order; the zone and quota checks need a valid config and working credentials."""
    found = credentials(session)
    aws_works = found[0].ok
    found += region(configured_region(context))
    try:
        config: HyperPodConfig | None = HyperPodConfig.from_context(context, environ=environ)
        groups = len(config.compute_groups)
        found.append(passed("config", f"cdk.json: {groups} compute group(s), zone {config.availability_zone_id}"))
    except StackConfigError as error:
        config = None
        found.append(failed("config", str(error)))
    if not aws_works:
        found.append(not_checked("quotas, zone, CDK bootstrap", "not checked: fix the credentials first"))
    else:
        if config is not None and config.cluster_lane:  # a jobs-only config creates no cluster
            found += quotas(config, session) + zone_offerings(config, session)
        found += cdk_bootstrap(session)
    stack_name = config.stack_name if config is not None and aws_works else ""
    return found + docker(environ) + node(environ) + hugging_face_token(environ, session, stack_name)


def report(found: list[Finding]) -> int:
    for finding in found:
        print(finding.line(), flush=True)
    failures = sum(finding.checked and not finding.ok for finding in found)
    skipped = sum(not finding.checked for finding in found)
    not_run = f"; {skipped} not checked (they need the failed ones)" if skipped else ""
    print(f"{failures} check(s) failed{not_run}" if failures else "all checks passed: `make deploy` can start")
    return 1 if failures else 0


def configured_region(context: Mapping[str, Any]) -> str:
    return str(context.get("region") or HyperPodConfig.region)


def run(*, context: Mapping[str, Any], profile: str | None) -> int:
    with aws_errors("start an AWS session"):
        session = boto3.Session(profile_name=profile, region_name=configured_region(context))
    return report(findings(context=context, session=session, environ=os.environ))
