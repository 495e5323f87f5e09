"""Who may read the Hugging Face token, and where the node role may write network interfaces."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.xdist_group("infra")


def role_arn(logical_id: str) -> dict:
    return {"Fn::GetAtt": [logical_id, "Arn"]}


def only_statement(synth, kind: str, sid: str) -> dict:
    resource = synth.template["Resources"][synth.logical_id(synth.stack.hub_token.key.node.default_child)]
    if kind != "AWS::KMS::Key":
        (_, resource) = synth.one(kind)
    document = resource["Properties"].get("ResourcePolicy") or resource["Properties"]["KeyPolicy"]
    (statement,) = [s for s in document["Statement"] if s.get("Sid") == sid]
    return statement


def test_only_the_node_role_reads_the_token_on_the_cluster_lane(synth):
    deny = only_statement(synth, "AWS::SecretsManager::ResourcePolicy", "OnlyTheRunRolesReadTheToken")
    node_role = synth.logical_id(synth.stack.role.role.node.default_child)
    assert (deny["Effect"], deny["Principal"]) == ("Deny", {"AWS": "*"})
    assert deny["Action"] == "secretsmanager:GetSecretValue"
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": [role_arn(node_role)]}}


def test_both_lanes_let_the_node_role_and_the_job_role_read_it(both_gpu_synth):
    deny = only_statement(both_gpu_synth, "AWS::SecretsManager::ResourcePolicy", "OnlyTheRunRolesReadTheToken")
    readers = deny["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
    stack = both_gpu_synth.stack
    expected = [stack.role.role, stack.job_role.role]
    assert readers == [role_arn(both_gpu_synth.logical_id(role.node.default_child)) for role in expected]


def test_the_key_decrypts_only_through_secrets_manager(synth, jobs_synth):
    for made in (synth, jobs_synth):
        deny = only_statement(made, "AWS::KMS::Key", "DecryptOnlyThroughSecretsManager")
        assert (deny["Effect"], deny["Action"]) == ("Deny", "kms:Decrypt")
        assert deny["Condition"] == {"StringNotEquals": {"kms:ViaService": "secretsmanager.us-west-2.amazonaws.com"}}


def test_every_eni_write_is_held_to_the_cluster_subnet_and_vpc(synth):
    policy_id = synth.logical_id(synth.stack.role.policy.node.default_child)
    statements = synth.template["Resources"][policy_id]["Properties"]["PolicyDocument"]["Statement"]
    subnet_id = synth.logical_id(synth.stack.network.private_subnet.node.default_child)
    vpc_id = synth.logical_id(synth.stack.network.vpc.node.default_child)
    on_enis = [s for s in statements if "network-interface/*" in json.dumps(s["Resource"])]
    writes = sorted(a for s in on_enis for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))
    assert writes == [
        "ec2:CreateNetworkInterface",
        "ec2:CreateNetworkInterfacePermission",
        "ec2:CreateTags",
        "ec2:DeleteNetworkInterface",
        "ec2:DeleteNetworkInterfacePermission",
    ]
    for statement in on_enis:
        scope = statement["Condition"]["StringEquals"]
        assert set(scope) == {"ec2:Subnet", "ec2:Vpc"}, statement["Sid"]
        assert f'"Ref": "{subnet_id}"' in json.dumps(scope["ec2:Subnet"])
        assert f'"Ref": "{vpc_id}"' in json.dumps(scope["ec2:Vpc"])
    # Detach authorizes the node instance too (SageMaker's account): the only ENI action left on "*".
    unscoped = [s for s in statements if s["Resource"] == "*" and "Condition" not in s]
    assert {s["Sid"] for s in unscoped} >= {"DetachNodeInterfaces"}
    assert not any("ec2:Delete" in json.dumps(s["Action"]) for s in unscoped)
