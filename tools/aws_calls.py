"""Every AWS call this project's code makes, by the side (and so the role) that makes it: docs/aws-calls.md.

The calls come from the code, not from a list: an AST scan of each Python module finds the boto3 clients it
makes (``boto3.client("x")``, ``session.client("x")``) and the methods called on them, and botocore's service
model turns each method into its API operation. A shell scan does the same for ``aws <service> <command>`` lines
in the node scripts. Which side runs a module is one rule, :data:`SIDES`. What the AWS services themselves do
with a role of ours (HyperPod making a node's network interface, Docker pulling an image) is no call of our code;
those are :data:`SERVICE_CALLS`, named with who makes them. tests/infra/test_infra_aws_calls.py checks that the
table is fresh and evaluates every row against the synthesized template's policies for its side's role.

``python -m tools.aws_calls`` rewrites the table (`make iam-table`); ``--check`` exits 1 when it is stale.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import botocore.exceptions
import botocore.session
from botocore import xform_name

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "aws-calls.md"

LAPTOP = "laptop"
CONTROLLER = "controller"
NODE = "node"  # login and compute nodes
TRAINING_JOB = "training job"
LAMBDA = "lambda"

# Which side runs the code under a path: the longest matching prefix wins. The laptop runs hpctl, predeploy
# and the tools with the user's own credentials; lifecycle/ runs on every node; the host-side jobs/ package
# runs on the controller (a chain's claim at submit) and on compute nodes (its release job); the payload steps
# run on compute nodes and inside training jobs; the compile cache is persisted by training jobs alone.
SIDES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hpctl/", (LAPTOP,)),
    ("stacks/", (LAPTOP,)),
    ("tools/", (LAPTOP,)),
    ("bench/", (LAPTOP,)),
    ("lifecycle/", (CONTROLLER, NODE)),
    ("payloads/llm_pipeline/jobs/", (CONTROLLER, NODE)),
    ("payloads/llm_pipeline/jobs/alerts.py", (NODE,)),  # a step's end (env.sh) or train's stall watch
    ("payloads/slurm/", (NODE,)),
    ("payloads/", (NODE, TRAINING_JOB)),
    ("payloads/llm_pipeline/compile_cache.py", (TRAINING_JOB,)),
)
SCANNED = ("hpctl", "stacks", "tools", "bench", "lifecycle", "payloads")
SHELL_SUFFIXES = (".sh", ".sbatch")

# boto3 methods that are no operation of the model, and the operations they make.
INJECTED = {
    ("s3", "upload_file"): ("PutObject",),  # boto3's transfer: PutObject, or multipart parts (s3:PutObject too)
    ("s3", "download_file"): ("GetObject",),
}
# AWS CLI commands that are no operation of the model (the CLI's own customizations).
CLI_COMMANDS = {
    ("ecr", "get-login-password"): "GetAuthorizationToken",
    ("ssm", "start-session"): "StartSession",  # the CLI's session-manager-plugin wrapper of the operation
}
# The IAM action an operation needs, where its name differs from the operation's (IAM's service authorization
# reference, as cfn-lint ships it: tools/iam_reference.py checks that every action in the table exists there).
IAM_ACTION_OF = {
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "HeadObject"): "s3:GetObject",
}
# The IAM prefix of a service, where botocore's signing name is not it.
IAM_PREFIX = {"monitoring": "cloudwatch", "sso": "sso", "pricing": "pricing"}


@dataclass(frozen=True)
class Call:
    side: str
    service: str  # the boto3 client name
    operation: str  # the API operation (botocore's model)
    where: str  # path:function of the call
    caller: str = ""  # for SERVICE_CALLS: who makes it

    @property
    def action(self) -> str:
        return iam_action(self.service, self.operation)


# Calls an AWS service or agent makes with one of our roles (no code of ours makes them): (boto3 client name,
# operation, who makes it), for each side that has them.
HYPERPOD_NODE_CALLS = (
    ("ec2", "DescribeNetworkInterfaces", "HyperPod, attaching a node to the VPC"),
    ("ec2", "DescribeVpcs", "HyperPod, attaching a node to the VPC"),
    ("ec2", "DescribeSubnets", "HyperPod, attaching a node to the VPC"),
    ("ec2", "DescribeSecurityGroups", "HyperPod, attaching a node to the VPC"),
    ("ec2", "DescribeDhcpOptions", "HyperPod, attaching a node to the VPC"),
    ("ec2", "CreateNetworkInterface", "HyperPod, attaching a node to the VPC"),
    ("ec2", "CreateTags", "HyperPod, tagging the node's interface"),
    ("ec2", "CreateNetworkInterfacePermission", "HyperPod, attaching a node to the VPC"),
    ("ec2", "DeleteNetworkInterfacePermission", "HyperPod, removing a node"),
    ("ec2", "DetachNetworkInterface", "HyperPod, removing a node"),
    ("ec2", "DeleteNetworkInterface", "HyperPod, removing a node"),
    ("s3", "ListObjectsV2", "HyperPod, fetching the lifecycle scripts (LifeCycleConfig.SourceS3Uri)"),
    ("s3", "GetObject", "HyperPod, fetching the lifecycle scripts (LifeCycleConfig.SourceS3Uri)"),
    ("logs", "CreateLogGroup", "HyperPod's node agent, the cluster's log group"),
    ("logs", "CreateLogStream", "HyperPod's node agent, one stream per node"),
    ("logs", "PutLogEvents", "HyperPod's node agent"),
    ("logs", "DescribeLogStreams", "HyperPod's node agent"),
    ("ecr", "BatchGetImage", "Docker/Enroot, pulling the stack's images"),
    ("ecr", "GetDownloadUrlForLayer", "Docker/Enroot, pulling the stack's images"),
    ("ecr", "BatchCheckLayerAvailability", "Docker/Enroot, pulling the stack's images"),
    ("amp", "RemoteWrite", "Prometheus (lifecycle/observability.sh), remote write"),
)
# SNS encrypts a message to the alerts topic with the topic's key for its publisher (the publisher's role needs
# both actions on that key).
SNS_PUBLISHER = "SNS, encrypting a run alert with the alerts topic's key"
SERVICE_CALLS: dict[str, tuple[tuple[str, str, str], ...]] = {
    CONTROLLER: (
        *HYPERPOD_NODE_CALLS,
        ("secretsmanager", "GetSecretValue", "HyperPod, writing slurmdbd.conf (AccountingDatabase)"),
        ("secretsmanager", "DescribeSecret", "HyperPod, writing slurmdbd.conf (AccountingDatabase)"),
        ("kms", "Decrypt", "Secrets Manager, decrypting the database secret for its reader"),
    ),
    NODE: (
        *HYPERPOD_NODE_CALLS,
        ("s3", "PutObject", "run steps writing to the data bucket"),
        ("s3", "DeleteObject", "run steps removing what they wrote in the data bucket"),
        ("s3", "AbortMultipartUpload", "boto3's transfer, abandoning a multipart upload"),
        ("kms", "Decrypt", "Secrets Manager, decrypting the Hub token for its reader"),
        ("kms", "GenerateDataKey", SNS_PUBLISHER),
        ("kms", "Decrypt", SNS_PUBLISHER),
    ),
    TRAINING_JOB: (
        ("ecr", "BatchGetImage", "SageMaker, pulling the job's image"),
        ("ecr", "GetDownloadUrlForLayer", "SageMaker, pulling the job's image"),
        ("ecr", "BatchCheckLayerAvailability", "SageMaker, pulling the job's image"),
        ("ecr", "GetAuthorizationToken", "SageMaker, pulling the job's image"),
        ("s3", "ListObjectsV2", "SageMaker, downloading the job's input channels"),
        ("s3", "GetObject", "SageMaker, downloading the job's input channels"),
        ("s3", "PutObject", "SageMaker, uploading the job's outputs and checkpoints"),
        ("s3", "DeleteObject", "SageMaker, syncing the job's checkpoints"),
        ("s3", "AbortMultipartUpload", "SageMaker, abandoning a multipart upload"),
        ("logs", "CreateLogGroup", "SageMaker, the job's log group"),
        ("logs", "CreateLogStream", "SageMaker, one stream per job and host"),
        ("logs", "PutLogEvents", "SageMaker, the job's logs"),
        ("logs", "DescribeLogStreams", "SageMaker, the job's logs"),
        ("cloudwatch", "PutMetricData", "SageMaker, the job's metrics"),
        ("kms", "Decrypt", "Secrets Manager, decrypting the Hub token for its reader"),
    ),
}

# What each action's request names, in the stack's own terms: the resource ARNs it authorizes (each must be
# allowed) and the condition keys it carries. {name}: filled in from the synthesized template (a list-valued
# name gives one resource each) by tests/infra/test_infra_aws_calls.py; {run}: any run's name.
EC2_NETWORK = {"ec2:Subnet": "{subnet_arn}", "ec2:Vpc": "{vpc_arn}"}
REQUESTS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "ec2:DescribeNetworkInterfaces": (("*",), {}),
    "ec2:DescribeVpcs": (("*",), {}),
    "ec2:DescribeSubnets": (("*",), {}),
    "ec2:DescribeSecurityGroups": (("*",), {}),
    "ec2:DescribeDhcpOptions": (("*",), {}),
    "ec2:CreateNetworkInterface": (("{subnet_arn}", "{security_group_arns}", "{eni_arn}"), EC2_NETWORK),
    "ec2:CreateTags": (("{eni_arn}",), EC2_NETWORK),
    "ec2:CreateNetworkInterfacePermission": (("{eni_arn}",), EC2_NETWORK),
    "ec2:DeleteNetworkInterfacePermission": (("{eni_arn}",), EC2_NETWORK),
    "ec2:DetachNetworkInterface": (("{eni_arn}", "{node_instance_arn}"), EC2_NETWORK),
    "ec2:DeleteNetworkInterface": (("{eni_arn}",), EC2_NETWORK),
    "s3:ListBucket": (("{bucket_arn}",), {"s3:prefix": "{read_prefix}"}),
    "s3:GetObject": (("{bucket_arn}/{read_key}",), {}),
    "s3:PutObject": (("{bucket_arn}/{write_key}",), {}),
    "s3:DeleteObject": (("{bucket_arn}/{write_key}",), {}),
    "s3:AbortMultipartUpload": (("{bucket_arn}/{write_key}",), {}),
    "logs:CreateLogGroup": (("{log_group_arn}",), {}),
    "logs:CreateLogStream": (("{log_group_arn}:log-stream:{run}",), {}),
    "logs:PutLogEvents": (("{log_group_arn}:log-stream:{run}",), {}),
    "logs:DescribeLogStreams": (("{log_group_arn}",), {}),  # IAM authorizes it on the group
    "ecr:BatchGetImage": (("{repository_arn}",), {}),
    "ecr:GetDownloadUrlForLayer": (("{repository_arn}",), {}),
    "ecr:BatchCheckLayerAvailability": (("{repository_arn}",), {}),
    "ecr:GetAuthorizationToken": (("*",), {}),
    "aps:RemoteWrite": (("{workspace_arn}",), {}),
    "secretsmanager:GetSecretValue": (("{secret_arn}",), {}),
    "secretsmanager:DescribeSecret": (("{secret_arn}",), {}),
    "kms:Decrypt": (("{secret_key_arn}",), {"kms:ViaService": "secretsmanager.{region}.amazonaws.com"}),
    "cloudwatch:PutMetricData": (("*",), {"cloudwatch:namespace": "{job_metrics_namespace}"}),
    "sagemaker:ListClusterNodes": (("{cluster_arn}",), {}),
    "sagemaker:BatchAddClusterNodes": (("{cluster_arn}",), {}),
    "sagemaker:BatchDeleteClusterNodes": (("{cluster_arn}",), {}),
    "sns:Publish": (("{topic_arn}",), {}),
}
# Where one action reaches two resources for two callers: the caller's own request (its row's bracketed name).
REQUESTS_OF_CALLER: dict[tuple[str, str], tuple[tuple[str, ...], dict[str, str]]] = {
    ("kms:Decrypt", SNS_PUBLISHER): (("{topic_key_arn}",), {"kms:ViaService": "sns.{region}.amazonaws.com"}),
    ("kms:GenerateDataKey", SNS_PUBLISHER): (("{topic_key_arn}",), {"kms:ViaService": "sns.{region}.amazonaws.com"}),
}


def requests_of(row: Row) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """The distinct requests behind one row: each caller's own (REQUESTS_OF_CALLER), else the action's."""
    found = []
    for where in row.where:
        request = REQUESTS_OF_CALLER.get((row.action, where.strip("()"))) or REQUESTS.get(row.action)
        if request is not None and request not in found:
            found.append(request)
    return found


def iam_actions() -> frozenset[str]:
    """Every action IAM's service authorization reference knows, as cfn-lint ships it (Policies.json), in lower
    case (IAM's action names are case-insensitive)."""
    import json

    import cfnlint

    reference = Path(cfnlint.__file__).parent / "data" / "AdditionalSpecs" / "Policies.json"
    services = json.loads(reference.read_text())
    return frozenset(f"{prefix}:{action}".lower() for prefix, entry in services.items() for action in entry["Actions"])


def side_of(relative: str) -> tuple[str, ...]:
    """The sides that run the file at ``relative`` (a POSIX path from the repository root): :data:`SIDES`."""
    matches = [(prefix, sides) for prefix, sides in SIDES if relative.startswith(prefix)]
    if not matches:
        raise KeyError(f"{relative}: no side in tools/aws_calls.SIDES; add its folder there")
    return max(matches, key=lambda match: len(match[0]))[1]


@cache
def service_model(service: str):
    return botocore.session.get_session().get_service_model(service)


@cache
def operations(service: str) -> dict[str, str]:
    """snake_case method -> API operation, for one boto3 client."""
    return {xform_name(name): name for name in service_model(service).operation_names}


def iam_action(service: str, operation: str) -> str:
    if (service, operation) in IAM_ACTION_OF:
        return IAM_ACTION_OF[(service, operation)]
    metadata = service_model(service).metadata
    signing = metadata.get("signingName") or metadata["endpointPrefix"]
    return f"{IAM_PREFIX.get(signing, signing)}:{operation}"


def _client_service(node: ast.AST) -> str | None:
    """``x.client("s3")`` / ``boto3.client("s3", ...)``: the service name."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "client"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def _receiver_name(node: ast.AST) -> str | None:
    """The last name of a call's receiver: ``s3`` for ``s3.x()``, ``client`` for ``self.client.x()``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def python_calls(path: Path, relative: str) -> Iterator[tuple[str, str, int]]:
    """(service, operation, line) for each AWS call in one module.

    A receiver is a client when it is a ``client(...)`` call itself, or a name the module binds to one
    (``s3 = session.client("s3")``, ``self.client = client``), or a parameter named after a service the
    module or its callers make a client of (``def describe_job(sagemaker, ...)``): then the method must be one
    of that service's operations, so a same-named method of anything else (``re.search``) is no call.
    """
    tree = ast.parse(path.read_text(), filename=relative)
    made = {service for node in ast.walk(tree) if (service := _client_service(node))}
    bound: dict[str, set[str]] = {GENERIC_CLIENT: made}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            service = _client_service(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if service:
                for target in targets:
                    if name := _receiver_name(target):
                        bound.setdefault(name, set()).add(service)
    # ``self.client = client`` after ``client = boto3.client(...)``: the attribute is the same client.
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in bound:
            for target in node.targets:
                if name := _receiver_name(target):
                    bound.setdefault(name, set()).update(bound[node.value.id])
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and (cli := _cli_argv(node)):
            yield (*cli, node.lineno)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver, method = node.func.value, node.func.attr
        services = {_client_service(receiver)} - {None}
        if not services:
            name = _receiver_name(receiver)
            services = bound.get(name or "", set()) | ({name} if name in KNOWN_CLIENTS else set())
        for service in sorted(services):
            for operation in _operations_of(service, method, node):
                yield service, operation, node.lineno


def _cli_argv(node: ast.List) -> tuple[str, str] | None:
    words = [e.value for e in node.elts[:3] if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if len(words) == 3 and words[0] == "aws":
        return cli_operation(words[1], words[2])
    return None


GENERIC_CLIENT = "client"
# Clients passed into a function by a parameter named after the service (``def run_progress(s3, ...)``).
KNOWN_CLIENTS = frozenset({"s3", "sagemaker", "logs", "cloudformation", "ec2", "fsx", "sts", "secretsmanager"})


def _operations_of(service: str, method: str, call: ast.Call) -> tuple[str, ...]:
    if (service, method) in INJECTED:
        return INJECTED[(service, method)]
    if method == "get_paginator" and call.args and isinstance(call.args[0], ast.Constant):
        method = call.args[0].value
    operation = operations(service).get(method)
    return (operation,) if operation else ()


CLI_LINE = re.compile(r"\baws\s+([a-z0-9-]+)\s+([a-z0-9-]+)")


def shell_calls(path: Path) -> Iterator[tuple[str, str, int]]:
    """``aws <service> <command>`` in a script, comments and quoted prose left out."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        code = re.sub(r'"[^"$]*"', "", code)  # prose in quotes ("... (aws sagemaker update-...)") is no call
        for service, command in CLI_LINE.findall(code):
            if found := cli_operation(service, command):
                yield (*found, number)


def cli_operation(service: str, command: str) -> tuple[str, str] | None:
    """(service, operation) of ``aws <service> <command>``; None for no AWS call."""
    try:
        operation = CLI_COMMANDS.get((service, command)) or operations(service).get(command.replace("-", "_"))
    except botocore.exceptions.UnknownServiceError:
        return None
    return (service, operation) if operation else None


def _functions(path: Path) -> dict[int, str]:
    """Line -> the innermost function (or Class.method) that holds it."""
    held: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    held.update(dict.fromkeys(range(child.lineno, (child.end_lineno or child.lineno) + 1), name))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return held


def code_calls(root: Path = ROOT) -> list[Call]:
    calls: set[Call] = set()
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if "/." in f"/{relative}" or "site-packages" in relative:
                continue
            if path.suffix == ".py":
                found: Iterable[tuple[str, str, int]] = python_calls(path, relative)
            elif path.suffix in SHELL_SUFFIXES:
                found = shell_calls(path)
            else:
                continue
            places = _functions(path) if path.suffix == ".py" else {}
            for service, operation, line in found:
                # The enclosing function, not the line: the table moves only when calls do.
                where = f"{relative}:{places[line]}" if places.get(line) else relative
                for side in side_of(relative):
                    calls.add(Call(side, service, operation, where))
    return sorted(calls, key=lambda c: (SIDE_ORDER.index(c.side), c.action, c.where))


def service_calls() -> list[Call]:
    return [
        Call(side, service, operation, "", caller)
        for side, calls in SERVICE_CALLS.items()
        for service, operation, caller in calls
    ]


SIDE_ORDER = (LAPTOP, CONTROLLER, NODE, TRAINING_JOB, LAMBDA)


@dataclass(frozen=True)
class Row:
    """One line of the table: one action on one side, with every place that needs it."""

    side: str
    action: str
    operation: str
    service: str
    where: tuple[str, ...]


def rows(root: Path = ROOT) -> list[Row]:
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for call in [*code_calls(root), *service_calls()]:
        key = (call.side, call.action, call.operation, call.service)
        grouped.setdefault(key, []).append(call.where or f"({call.caller})")
    ordered = sorted(grouped, key=lambda k: (SIDE_ORDER.index(k[0]), k[1], k[2]))
    return [Row(*key, where=tuple(sorted(set(grouped[key])))) for key in ordered]


ROLE_OF_SIDE = {
    LAPTOP: "the user's own credentials (not in the template; see docs/deploy.md)",
    CONTROLLER: "the controller group's execution role (its own where the sides differ: stacks/stack.py)",
    NODE: "the node role (login and compute groups; stacks/iam.py)",
    TRAINING_JOB: "the job role (stacks/jobs.py)",
}


def render(table_rows: list[Row]) -> str:
    lines = [
        "# Every AWS call, by the role that makes it",
        "",
        "Generated by `make iam-table` (tools/aws_calls.py) from the code: do not edit by hand. Each row is an IAM",
        "action one side needs, with the places in the code that make the call, or (in brackets) the AWS service",
        "or agent that makes it with our role. tests/infra/test_infra_aws_calls.py evaluates every row but the",
        "laptop's against the synthesized template's policies for that side's role, and fails for a grant that no",
        "row needs.",
        "",
        "The stack defines no Lambda handler of its own: its Lambda functions are CDK's (the bucket deployment, the",
        "bucket auto-delete, the default security group's restriction), each with the role CDK makes for it.",
        "",
    ]
    for side in SIDE_ORDER:
        mine = [row for row in table_rows if row.side == side]
        if not mine:
            continue
        lines += [f"## {side}: {ROLE_OF_SIDE[side]}", "", "| action | operation | made by |", "|---|---|---|"]
        lines += [f"| `{r.action}` | {r.service} {r.operation} | {', '.join(r.where)} |" for r in mine]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/aws-calls.md from the code.")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/aws-calls.md is not fresh")
    args = parser.parse_args(argv)
    text = render(rows())
    if args.check:
        if TABLE.read_text() != text:
            print(f"error: {TABLE.relative_to(ROOT)} is stale: run `make iam-table`", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
