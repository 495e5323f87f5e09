"""Every AWS call against the role that makes it (docs/aws-calls.md, tools/aws_calls.py).

Each row of the table is evaluated with moto's IAM policy evaluator (moto.iam.access_control.IAMPolicy, the
one moto's access control runs) against the synthesized template's policies for the row's side: the inline
policies on the role, the customer managed ones it attaches, and the AWS managed ones it names (their documents
in tools/aws_managed_policies/). The request carries the resource ARN and the condition keys of
tools/aws_calls.REQUESTS. Then every grant of ours (an action on a resource, in a statement of ours) is removed
in turn from a copy, and some row of that role must fail, naming the call: a grant no call needs is an error.

moto's evaluator reads StringEquals conditions and treats other operators as met; the conditions on our
grants that it cannot read (StringLike, IfExists) are checked by the template tests of each construct.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto.iam.access_control import IAMPolicy, PermissionResult

from cluster_contract import JOB_INPUT_PREFIXES, JOB_LOG_GROUP, JOB_OUTPUT_PREFIXES
from stacks.jobs import METRICS_NAMESPACE
from tools import aws_calls

pytestmark = pytest.mark.xdist_group("infra")

MANAGED_POLICIES = aws_calls.ROOT / "tools" / "aws_managed_policies"
AWS_MANAGED = ":iam::aws:policy/"
NODE_SIDES = (aws_calls.CONTROLLER, aws_calls.NODE)


def resolver(synth) -> Any:
    """Intrinsics to strings, the same way for the policies and the requests: a Ref is its logical id, a GetAtt
    ``id.attr``, and pseudo parameters the config's values."""
    pseudo = {
        "AWS::Partition": "aws",
        "AWS::Region": synth.config.region,
        "AWS::AccountId": synth.config.account,
        "AWS::URLSuffix": "amazonaws.com",
    }

    def resolve(value: Any) -> Any:
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "Ref" in value:
            return pseudo.get(value["Ref"], f"ref.{value['Ref']}")
        if "Fn::GetAtt" in value:
            return "getatt." + ".".join(value["Fn::GetAtt"])
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(resolve(parts))
        if "Fn::Select" in value:
            index, items = value["Fn::Select"]
            return resolve(items)[index]
        if "Fn::Split" in value:
            separator, text = value["Fn::Split"]
            return resolve(text).split(separator)
        return {key: resolve(v) for key, v in value.items()}

    return lambda token: resolve(synth.stack.resolve(token)) if not isinstance(token, dict) else resolve(token)


@dataclass
class Policy:
    name: str  # the template's logical id, or the AWS managed policy's name
    document: dict
    ours: bool  # False for an AWS managed policy: not ours to remove from


def role_policies(synth, role: Any) -> list[Policy]:
    """Inline, customer managed and AWS managed policies of one role in the synthesized template."""
    resolve = resolver(synth)
    role_id = synth.logical_id(role.node.default_child)
    resources = synth.template["Resources"]
    found = []
    for key, res in resources.items():
        props = res["Properties"]
        if res["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in props.get("Roles", []):
            found.append(Policy(key, resolve(props["PolicyDocument"]), ours=True))
    for arn in resources[role_id]["Properties"].get("ManagedPolicyArns", []):
        if isinstance(arn, dict) and "Ref" in arn:
            document = resources[arn["Ref"]]["Properties"]["PolicyDocument"]
            found.append(Policy(arn["Ref"], resolve(document), ours=True))
            continue
        name = resolve(arn).split(AWS_MANAGED, 1)[1]
        data = MANAGED_POLICIES / f"{name}.json"
        assert data.is_file(), f"{name}: the role attaches it; store its document as {data.relative_to(aws_calls.ROOT)}"
        found.append(Policy(name, json.loads(data.read_text())["document"], ours=False))
    return found


def side_roles(synth) -> dict[str, Any]:
    stack = synth.stack
    roles = {}
    if synth.config.cluster_lane:
        roles.update({aws_calls.CONTROLLER: stack.controller_role.role, aws_calls.NODE: stack.role.role})
    if synth.config.jobs_lane:
        roles[aws_calls.TRAINING_JOB] = stack.job_role.role
    return roles


def placeholders(synth, side: str) -> dict[str, list[str] | None]:
    """Each {name} of tools/aws_calls.REQUESTS in this app, for one side; None where the app has no such thing
    (no database, no metrics workspace, no scaled group): the rows that need it do not apply."""
    resolve = resolver(synth)
    stack, config = synth.stack, synth.config
    region, account = config.region, config.account
    run = "demo"
    found: dict[str, list[str] | None] = {
        "region": [region],
        "run": [run],
        # Nodes read and write anywhere in the bucket; a job reads each of its prefixes and writes its outputs.
        "read_prefix": [f"{prefix}/{run}/" for prefix in (*JOB_INPUT_PREFIXES, *JOB_OUTPUT_PREFIXES)],
        "read_key": [f"{prefix}/{run}/file" for prefix in (*JOB_INPUT_PREFIXES, *JOB_OUTPUT_PREFIXES)],
        "write_key": [f"{prefix}/{run}/file" for prefix in JOB_OUTPUT_PREFIXES],
        "bucket_arn": [resolve(stack.data.bucket.bucket_arn)],
        "job_metrics_namespace": [METRICS_NAMESPACE],
    }
    if side == aws_calls.TRAINING_JOB:
        repository = next(iter(stack.job_images.values())).asset.repository
        return {
            **found,
            "repository_arn": [resolve(repository.repository_arn)],
            "log_group_arn": [f"arn:aws:logs:{region}:{account}:log-group:{JOB_LOG_GROUP}"],
            "secret_arn": [resolve(stack.hub_token.arn)],
            "secret_key_arn": [resolve(stack.hub_token.key.key_arn)],
        }
    network = stack.network
    ec2 = f"arn:aws:ec2:{region}:{account}"
    database = stack.accounting_database
    groups = [network.security_group.group]
    if side == aws_calls.CONTROLLER and database:
        groups.append(database.controller_security_group)
    scaled = any(group.scale_with_runs for group in config.compute_groups)
    return {
        **found,
        "subnet_arn": [f"{ec2}:subnet/{resolve(network.private_subnet.subnet_id)}"],
        "vpc_arn": [f"{ec2}:vpc/{resolve(network.vpc.vpc_id)}"],
        "security_group_arns": [f"{ec2}:security-group/{resolve(g.security_group_id)}" for g in groups],
        "eni_arn": [f"{ec2}:network-interface/eni-0123456789abcdef0"],
        # A HyperPod node lives in SageMaker's account: its ARN cannot be ours.
        "node_instance_arn": ["arn:aws:ec2:{region}:111122223333:instance/i-0123456789abcdef0"],
        "repository_arn": [resolve(next(iter(stack.images.values())).asset.repository.repository_arn)],
        "log_group_arn": [
            f"arn:aws:logs:{region}:{account}:log-group:/aws/sagemaker/Clusters/{config.cluster_name}/x1"
        ],
        "workspace_arn": [resolve(stack.metrics.workspace.attr_arn)] if stack.metrics else None,
        "secret_arn": (
            ([resolve(database.secret_arn)] if database else None)
            if side == aws_calls.CONTROLLER
            else [resolve(stack.hub_token.arn)]
        ),
        "secret_key_arn": (
            ([resolve(database.key.key_arn)] if database else None)
            if side == aws_calls.CONTROLLER
            else [resolve(stack.hub_token.key.key_arn)]
        ),
        "cluster_arn": [resolve(stack.cluster.arn)] if scaled else None,
        "topic_arn": [resolve(stack.alerts.topic_arn)],
        "topic_key_arn": [resolve(stack.alerts.key.key_arn)],
    }


@dataclass(frozen=True)
class Request:
    row: aws_calls.Row
    resources: tuple[str, ...]
    context: dict

    def __str__(self) -> str:
        return f"{self.row.side}: {self.row.action} ({', '.join(self.row.where)}) on {', '.join(self.resources)}"


def fill(text: str, values: dict[str, list[str] | None]) -> list[str] | None:
    """``text`` with each {name} filled in, one result per value of a list; None when a name has none here."""
    results = [text]
    for name in [part.split("}")[0] for part in text.split("{")[1:]]:
        if values.get(name) is None:
            return None
        results = [r.replace(f"{{{name}}}", v, 1) for r in results for v in values[name]]
    return results


def requests(synth, side: str, table_rows: list[aws_calls.Row]) -> Iterator[Request]:
    """The side's rows as requests in this app: the ones whose resources exist here."""
    values = placeholders(synth, side)
    for row in table_rows:
        if row.side != side:
            continue
        found = aws_calls.requests_of(row)
        assert found, f"{row.action}: add its resource to tools/aws_calls.REQUESTS"
        for templates, conditions in found:
            resources = [fill(t, values) for t in templates]
            context = {key: fill(v, values) for key, v in conditions.items()}
            if any(r is None for r in resources) or any(v is None for v in context.values()):
                continue
            yield Request(row, tuple(r for group in resources for r in group), {k: v[0] for k, v in context.items()})


def applies(statement: dict, request: Request, resource: str) -> bool:
    """Whether one statement matches the request (action, resource and conditions), by moto's evaluator read as
    an Allow: moto answers DENIED for an Allow statement whose condition fails even where its resource is another
    (kms:Decrypt of the Hub token's key, held to Secrets Manager, would deny the alerts key's), so each statement
    is asked alone and only a PERMITTED counts as a match."""
    alone = {"Version": "2012-10-17", "Statement": [{**statement, "Effect": "Allow"}]}
    result = IAMPolicy(json.dumps(alone)).is_action_permitted(
        request.row.action, resource, incoming_condition_values=request.context
    )
    return result == PermissionResult.PERMITTED


def allowed(policies: list[Policy], request: Request) -> bool:
    """IAM's combination: an explicit deny that matches wins, else any allow that matches."""
    for resource in request.resources:
        statements = [st for p in policies for st in as_list(p.document["Statement"])]
        matching = [st["Effect"] for st in statements if applies(st, request, resource)]
        if "Deny" in matching or "Allow" not in matching:
            return False
    return True


def shapes(synth, external_db_synth, jobs_synth) -> dict[str, Any]:
    """The default app (one role for every group), the external database with a scaled group (the
    controller's own role, the scaler's grant) and the jobs lane (the job role)."""
    return {"default": synth, "external-db": external_db_synth, "jobs": jobs_synth}


@pytest.fixture(scope="module")
def table_rows() -> list[aws_calls.Row]:
    """The table's rows from the code now, scanned once for the module (each scan parses every source file)."""
    return aws_calls.rows()


@pytest.fixture(scope="module")
def apps(synth, external_db_synth, jobs_synth) -> dict[str, Any]:
    return shapes(synth, external_db_synth, jobs_synth)


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def grants(policies: list[Policy]) -> Iterator[tuple[str, list[Policy]]]:
    """(what, the policies without it) for each action on each resource of each Allow statement of ours."""
    for index, policy in enumerate(policies):
        if not policy.ours:
            continue
        for number, statement in enumerate(as_list(policy.document["Statement"])):
            if statement["Effect"] != "Allow":
                continue
            actions, resources = as_list(statement["Action"]), as_list(statement["Resource"])
            for action in actions:
                for resource in resources:
                    rest = [a for a in actions if a != action]
                    kept = [r for r in resources if r != resource]
                    split = [{**statement, "Action": rest}] if rest else []
                    split += [{**statement, "Action": [action], "Resource": kept}] if kept else []
                    document = copy.deepcopy(policy.document)
                    statements = as_list(document["Statement"])
                    document["Statement"] = [*statements[:number], *split, *statements[number + 1 :]]
                    where = f"{policy.name} statement {statement.get('Sid', number)}: {action} on {resource}"
                    yield where, [*policies[:index], Policy(policy.name, document, True), *policies[index + 1 :]]


def roles_and_requests(app, table_rows: list[aws_calls.Row]) -> Iterator[tuple[Any, list[Request]]]:
    """Each distinct role of the app with the requests of every side that runs as it."""
    by_role: dict[str, tuple[Any, list[Request]]] = {}
    for side, role in side_roles(app).items():
        key = app.logical_id(role.node.default_child)
        by_role.setdefault(key, (role, []))[1].extend(requests(app, side, table_rows))
    yield from by_role.values()


def test_the_table_is_fresh(table_rows):
    """docs/aws-calls.md is what `make iam-table` writes from the code now."""
    assert aws_calls.TABLE.read_text() == aws_calls.render(table_rows), "run `make iam-table`"


def test_every_role_action_in_the_table_is_one_iam_knows_with_a_request_to_evaluate(table_rows):
    """The actions our roles are evaluated for exist in IAM's reference (cfn-lint's copy lags botocore's model
    for the newest laptop-side APIs, which no role of ours grants), each with its request to evaluate."""
    evaluated = {row.action for row in table_rows if row.side != aws_calls.LAPTOP}
    assert sorted(a for a in evaluated if a.lower() not in aws_calls.iam_actions()) == []
    assert [row.action for row in table_rows if row.side != aws_calls.LAPTOP and not aws_calls.requests_of(row)] == []


@pytest.mark.parametrize("shape", ["default", "external-db", "jobs"])
def test_every_call_is_allowed_to_the_role_of_its_side(apps, shape, table_rows):
    app = apps[shape]
    denied = []
    evaluated = 0
    for role, role_requests in roles_and_requests(app, table_rows):
        policies = role_policies(app, role)
        for request in role_requests:
            evaluated += 1
            if not allowed(policies, request):
                denied.append(str(request))
    assert denied == [] and evaluated


@pytest.mark.parametrize("shape", ["default", "external-db", "jobs"])
def test_every_grant_is_needed_by_a_call(apps, shape, table_rows):
    """Remove each grant of ours in turn: some call of that role must then be denied (named here)."""
    app = apps[shape]
    unneeded = []
    for role, role_requests in roles_and_requests(app, table_rows):
        policies = role_policies(app, role)
        assert all(allowed(policies, r) for r in role_requests)
        for where, without in grants(policies):
            failing = [str(r) for r in role_requests if not allowed(without, r)]
            if not failing:
                unneeded.append(where)
    assert unneeded == [], "grants no call in docs/aws-calls.md needs"


def test_without_the_scalers_grant_its_calls_are_denied_by_name(apps, table_rows):
    """The evaluator against the fault it exists for: the issue's AccessDenied at a chain's first claim."""
    app = apps["external-db"]
    scaler_policy = app.logical_id(app.stack.node.find_child("CapacityScaling").node.default_child)
    denied = set()
    for role, role_requests in roles_and_requests(app, table_rows):
        without = [p for p in role_policies(app, role) if p.name != scaler_policy]
        denied |= {(r.row.side, r.row.action, r.row.where) for r in role_requests if not allowed(without, r)}
    where = ("payloads/llm_pipeline/jobs/capacity.py",)
    assert {(side, action) for side, action, _ in denied} == {
        (side, f"sagemaker:{operation}")
        for side in NODE_SIDES
        for operation in ("ListClusterNodes", "BatchAddClusterNodes", "BatchDeleteClusterNodes")
    }
    assert all(w.startswith(where) for _, _, places in denied for w in places)


def test_the_scan_finds_clients_made_bound_and_passed_and_nothing_else(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import re\nimport boto3\n"
        "def made():\n    return boto3.client('s3').get_object(Bucket='b', Key='k')\n"
        "def bound(session):\n    logs = session.client('logs')\n    logs.get_paginator('describe_log_groups')\n"
        "def passed(sagemaker):\n    return sagemaker.describe_cluster(ClusterName='c')\n"
        "def prose():\n    return re.search('x', 'y'), ['aws', 'ssm', 'start-session']\n"
    )
    found = {(service, operation) for service, operation, _ in aws_calls.python_calls(module, "payloads/module.py")}
    assert found == {
        ("s3", "GetObject"),
        ("logs", "DescribeLogGroups"),
        ("sagemaker", "DescribeCluster"),
        ("ssm", "StartSession"),
    }
    with pytest.raises(KeyError, match=r"nowhere/x\.py: no side in tools/aws_calls\.SIDES"):
        aws_calls.side_of("nowhere/x.py")
    assert aws_calls.side_of("payloads/llm_pipeline/compile_cache.py") == (aws_calls.TRAINING_JOB,)
