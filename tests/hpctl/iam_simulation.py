"""IAM's answers about the job role, from the role and policy the stack really synthesizes.

moto has no iam:SimulatePrincipalPolicy, so botocore's Stubber answers the sagemaker SDK's role
check; the answers are worked out here from the jobs-only template snapshot (tests/infra keeps it
equal to the code) with the rules IAM's policy simulator applies to such a request:

- the request's resource is ``*`` when ResourceArns is not given, and a statement's Resource
  pattern is matched against that literal (so only ``*`` matches ``*``);
- a condition key the request's context lacks holds only when its operator ends in ``IfExists``
  (the SDK sends no context; the job-call test below sends what the real call would carry);
- an explicit Deny wins, then an Allow, else ``implicitDeny``; the role's permissions boundary is
  judged the same way and reported as PermissionsBoundaryDecisionDetail, as IAM does.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import quote

SNAPSHOT = Path(__file__).resolve().parents[1] / "infra" / "__snapshots__" / "HyperPodJobsOnly.template.json"


def stand_in_arn(resource_type: str, logical_id: str) -> str:
    """The ARN a deploy would give the stack's secret or KMS key (named by logical id here)."""
    service, kind = {"AWS::SecretsManager::Secret": ("secretsmanager", "secret:"), "AWS::KMS::Key": ("kms", "key/")}[
        resource_type
    ]
    return f"arn:aws:{service}:us-west-2:123456789012:{kind}{logical_id}"


def _resolve(value, bucket_arns: dict[str, str]):
    """The template's intrinsic functions that the role policy uses, with the bucket named (and the
    Hugging Face token's secret and key at their stand-in ARNs)."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        logical_id, attribute = value["Fn::GetAtt"]
        assert attribute == "Arn", value
        return bucket_arns[logical_id]
    if isinstance(value, dict) and "Ref" in value:
        return bucket_arns[value["Ref"]]
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_resolve(part, bucket_arns) for part in parts)
    if isinstance(value, dict):
        return {key: _resolve(item, bucket_arns) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, bucket_arns) for item in value]
    return value


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _condition_holds(operator: str, values: dict, context: dict[str, str]) -> bool:
    for key, wanted in values.items():
        if key not in context:
            if not operator.endswith("IfExists"):
                return False
            continue
        patterns = _as_list(wanted)
        if operator.startswith("StringLike"):
            if not any(fnmatchcase(context[key], pattern) for pattern in patterns):
                return False
        elif operator.startswith("StringEquals"):
            if context[key] not in patterns:
                return False
        else:
            raise AssertionError(f"no rule here for condition operator {operator}")
    return True


class JobRole:
    """The job role of the jobs-only template: its trust policy, its policy statements (from its
    managed policies) and its permissions boundary's statements."""

    def __init__(self, *, bucket: str, template: Path = SNAPSHOT) -> None:
        resources = json.loads(template.read_text())["Resources"]
        buckets = {key: f"arn:aws:s3:::{bucket}" for key, res in resources.items() if res["Type"] == "AWS::S3::Bucket"}
        for key, res in resources.items():
            if res["Type"] in ("AWS::SecretsManager::Secret", "AWS::KMS::Key"):
                buckets[key] = stand_in_arn(res["Type"], key)

        def job_role(kind: str) -> list[dict]:
            return [res for key, res in resources.items() if res["Type"] == kind and key.startswith("JobRole")]

        def statements(ref: dict) -> list[dict]:
            policy = resources[ref["Ref"]]
            assert policy["Type"] == "AWS::IAM::ManagedPolicy", ref
            return _resolve(policy["Properties"]["PolicyDocument"]["Statement"], buckets)

        (role,) = job_role("AWS::IAM::Role")
        properties = role["Properties"]
        self.trust_policy = properties["AssumeRolePolicyDocument"]
        self.statements = [statement for ref in properties["ManagedPolicyArns"] for statement in statements(ref)]
        self.boundary: list[dict] | None = statements(properties["PermissionsBoundary"])

    @staticmethod
    def _matches(statement: dict, action: str, resource: str, context: dict[str, str]) -> bool:
        actions = [a.lower() for a in _as_list(statement["Action"])]
        if not any(fnmatchcase(action.lower(), pattern) for pattern in actions):
            return False
        if not any(fnmatchcase(resource, pattern) for pattern in _as_list(statement["Resource"])):
            return False
        return all(_condition_holds(op, values, context) for op, values in statement.get("Condition", {}).items())

    @classmethod
    def _judge(cls, statements: list[dict], action: str, resource: str, context: dict[str, str]) -> str:
        matching = [s["Effect"] for s in statements if cls._matches(s, action, resource, context)]
        if "Deny" in matching:
            return "explicitDeny"
        return "allowed" if "Allow" in matching else "implicitDeny"

    def decision(self, action: str, resource: str = "*", context: dict[str, str] | None = None) -> str:
        """The role's verdict: its policies' and, where it has one, its boundary's."""
        own = self._judge(self.statements, action, resource, context or {})
        if own == "explicitDeny" or self.boundary is None:
            return own
        return own if self.allowed_by_boundary(action, resource, context) else "implicitDeny"

    def allowed_by_boundary(self, action: str, resource: str = "*", context: dict[str, str] | None = None) -> bool:
        return self.boundary is None or self._judge(self.boundary, action, resource, context or {}) == "allowed"

    def simulate(self, actions: list[str], resources: list[str] | None = None) -> dict:
        """A SimulatePrincipalPolicy response for these actions (and resources)."""
        results = []
        for action in actions:
            for resource in resources or ["*"]:
                result = {
                    "EvalActionName": action,
                    "EvalResourceName": resource,
                    "EvalDecision": self.decision(action, resource),
                }
                if self.boundary is not None:
                    allowed = self.allowed_by_boundary(action, resource)
                    result["PermissionsBoundaryDecisionDetail"] = {"AllowedByPermissionsBoundary": allowed}
                results.append(result)
        return {"EvaluationResults": results, "IsTruncated": False}

    def get_role(self, arn: str) -> dict:
        """A GetRole response: IAM returns the trust policy URL-encoded."""
        name = arn.split(":role/")[1]
        created = datetime(2026, 11, 1, tzinfo=timezone.utc)
        role = {"Path": "/", "RoleName": name, "RoleId": "AROAHPLJOBROLE0000000", "Arn": arn, "CreateDate": created}
        return {"Role": {**role, "AssumeRolePolicyDocument": quote(json.dumps(self.trust_policy))}}
