"""IAM's answers about the job role, from the role and policy the stack really synthesizes.

moto has no iam:SimulatePrincipalPolicy, so botocore's Stubber answers the sagemaker SDK's role
check; the answers are worked out here from the jobs-only template snapshot (tests/infra keeps it
equal to the code) with the rules IAM's policy simulator applies to such a request:

- the request's resource is ``*`` when ResourceArns is not given, and a statement's Resource
  pattern is matched against that literal (so only ``*`` matches ``*``);
- no request context is sent, so a condition holds only when its operator ends in ``IfExists``;
- an explicit Deny wins, then an Allow, else ``implicitDeny``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import quote

SNAPSHOT = Path(__file__).resolve().parents[1] / "infra" / "__snapshots__" / "HyperPodJobsOnly.template.json"


def _resolve(value, bucket_arns: dict[str, str]):
    """The template's intrinsic functions that the role policy uses, with the bucket named."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        logical_id, attribute = value["Fn::GetAtt"]
        assert attribute == "Arn", value
        return bucket_arns[logical_id]
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


class JobRole:
    """The job role of the jobs-only template: its trust policy and its policy statements."""

    def __init__(self, *, bucket: str, template: Path = SNAPSHOT) -> None:
        resources = json.loads(template.read_text())["Resources"]
        buckets = {key: f"arn:aws:s3:::{bucket}" for key, res in resources.items() if res["Type"] == "AWS::S3::Bucket"}

        def job_role(kind: str) -> list[dict]:
            return [res for key, res in resources.items() if res["Type"] == kind and key.startswith("JobRole")]

        (role,) = job_role("AWS::IAM::Role")
        policies = job_role("AWS::IAM::Policy")
        self.trust_policy = role["Properties"]["AssumeRolePolicyDocument"]
        self.statements = [
            statement
            for policy in policies
            for statement in _resolve(policy["Properties"]["PolicyDocument"]["Statement"], buckets)
        ]

    def _matches(self, statement: dict, action: str, resource: str) -> bool:
        actions = [a.lower() for a in _as_list(statement["Action"])]
        if not any(fnmatchcase(action.lower(), pattern) for pattern in actions):
            return False
        if not any(fnmatchcase(resource, pattern) for pattern in _as_list(statement["Resource"])):
            return False
        return all(operator.endswith("IfExists") for operator in statement.get("Condition", {}))

    def decision(self, action: str, resource: str = "*") -> str:
        matching = [s["Effect"] for s in self.statements if self._matches(s, action, resource)]
        if "Deny" in matching:
            return "explicitDeny"
        return "allowed" if "Allow" in matching else "implicitDeny"

    def simulate(self, actions: list[str], resources: list[str] | None = None) -> dict:
        """A SimulatePrincipalPolicy response for these actions (and resources)."""
        results = [
            {"EvalActionName": action, "EvalResourceName": resource, "EvalDecision": self.decision(action, resource)}
            for action in actions
            for resource in resources or ["*"]
        ]
        return {"EvaluationResults": results, "IsTruncated": False}

    def get_role(self, arn: str) -> dict:
        """A GetRole response: IAM returns the trust policy URL-encoded."""
        name = arn.split(":role/")[1]
        created = datetime(2026, 11, 1, tzinfo=timezone.utc)
        role = {"Path": "/", "RoleName": name, "RoleId": "AROAHPLJOBROLE0000000", "Arn": arn, "CreateDate": created}
        return {"Role": {**role, "AssumeRolePolicyDocument": quote(json.dumps(self.trust_policy))}}
