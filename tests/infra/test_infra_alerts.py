"""Push alerts in the template (stacks/alerts.py): the encrypted topic, HyperPod's event rules into it, the e-mail
subscriptions from cdk.json, the node role's grant on that topic only, and the facts that tell the run side."""

from __future__ import annotations

import json

import pytest

from stacks.alerts import CLUSTER_EVENT, CLUSTER_STATE, EVENT_SOURCE, NODE_HEALTH, PUBLISH_KEY_ACTIONS
from stacks.config import HyperPodConfig, StackConfigError


def statements_of(synth, action: str) -> list[dict]:
    """Every IAM statement in the template (policies and key/topic policies alike) that allows ``action``."""
    found = []
    for resource in synth.template["Resources"].values():
        properties = resource.get("Properties", {})
        document = properties.get("PolicyDocument") or properties.get("KeyPolicy") or {}
        for statement in document.get("Statement", []):
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if action in actions:
                found.append(statement)
    return found


def test_topic_is_encrypted_with_its_own_rotating_key(synth):
    topic_id, topic = synth.one("AWS::SNS::Topic")
    key_ref = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = synth.template["Resources"][key_ref]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    assert key_ref == synth.logical_id(synth.stack.alerts.key.node.default_child)
    # EventBridge may make data keys for it, for this account only; nobody else outside the account's IAM.
    (events,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if s.get("Sid") == "EventBridgeOfThisAccount"]
    assert events["Principal"] == {"Service": "events.amazonaws.com"}
    assert sorted(events["Action"]) == sorted(PUBLISH_KEY_ACTIONS)
    assert events["Condition"]["StringEquals"]["aws:SourceAccount"] == synth.config.account
    # Publishing over plain HTTP is refused (the topic policy denies aws:SecureTransport false).
    (policy,) = synth.resources("AWS::SNS::TopicPolicy").values()
    denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)
    assert {"Ref": topic_id} in policy["Properties"]["Topics"]


def test_hyperpod_event_rules_feed_the_topic_for_this_cluster_only(synth):
    topic_id, _ = synth.one("AWS::SNS::Topic")
    rules = synth.resources("AWS::Events::Rule").values()
    patterns = [rule["Properties"]["EventPattern"] for rule in rules]
    assert all(rule["Properties"]["Targets"][0]["Arn"] == {"Ref": topic_id} for rule in rules)
    assert all(pattern["source"] == [EVENT_SOURCE] for pattern in patterns)
    by_type = {}
    for pattern in patterns:
        by_type.setdefault(pattern["detail-type"][0], []).append(pattern["detail"])
    name = [synth.config.cluster_name]
    assert by_type[NODE_HEALTH] == [{"ClusterName": name}]
    assert by_type[CLUSTER_STATE] == [{"ClusterName": name, "ClusterStatus": ["Failed", "RollingBack"]}]
    events = sorted(by_type[CLUSTER_EVENT], key=json.dumps)
    assert [event["EventDetails"]["ClusterName"] for event in events] == [name, name]
    assert {"EventLevel": ["Warn", "Error"]}.items() <= events[0]["EventDetails"].items() or {
        "EventLevel": ["Warn", "Error"]
    }.items() <= events[1]["EventDetails"].items()
    assert any(event["EventDetails"].get("Description") == [{"wildcard": "*instance replacement*"}] for event in events)
    # The topic lets EventBridge publish (CDK's target adds it): without it the rules would deliver nothing.
    (policy,) = synth.resources("AWS::SNS::TopicPolicy").values()
    allows = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert any(s["Principal"] == {"Service": "events.amazonaws.com"} and s["Action"] == "sns:Publish" for s in allows)


def test_only_the_node_role_may_publish_and_only_to_this_topic(synth):
    topic_id, _ = synth.one("AWS::SNS::Topic")
    node_policy = synth.logical_id(synth.stack.role.policy.node.default_child)
    publishers = [
        (key, s)
        for key, resource in synth.resources("AWS::IAM::Policy").items()
        for s in resource["Properties"]["PolicyDocument"]["Statement"]
        if any(
            str(action).startswith("sns:")
            for action in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
        )
    ]
    assert publishers == [
        (
            node_policy,
            {"Action": "sns:Publish", "Effect": "Allow", "Resource": {"Ref": topic_id}, "Sid": "PublishRunAlerts"},
        )
    ]
    key_id = synth.logical_id(synth.stack.alerts.key.node.default_child)
    (encrypt,) = [
        s
        for _, s in [(None, s) for s in statements_of(synth, "kms:GenerateDataKey")]
        if s.get("Sid") == "EncryptRunAlerts"
    ]
    assert encrypt["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}


def test_facts_tell_the_run_side_the_topic_and_the_stall_time(synth):
    facts = synth.stack.facts
    assert synth.stack.resolve(facts["alerts_topic_arn"]) == {"Ref": synth.one("AWS::SNS::Topic")[0]}
    assert facts["alert_stall_minutes"] == 30


def test_email_subscriptions_come_from_cdk_json(synthesize_from, source_root):
    synth = synthesize_from(source_root, alert_emails=["ops@example.com", "oncall@example.org"])
    topic_id, _ = synth.one("AWS::SNS::Topic")
    subscriptions = synth.resources("AWS::SNS::Subscription").values()
    assert sorted((s["Properties"]["Protocol"], s["Properties"]["Endpoint"]) for s in subscriptions) == [
        ("email", "oncall@example.org"),
        ("email", "ops@example.com"),
    ]
    assert all(s["Properties"]["TopicArn"] == {"Ref": topic_id} for s in subscriptions)


def test_default_has_no_subscription(synth):
    assert synth.resources("AWS::SNS::Subscription") == {}


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"alert_emails": ["not-an-address"]}, "config key 'alert_emails'"),
        ({"alert_emails": ["a@example.com", "a@example.com"]}, "distinct e-mail addresses"),
        ({"alert_emails": 5}, "a list of e-mail addresses"),
        ({"alert_stall_minutes": -1}, "config key 'alert_stall_minutes'"),
    ],
)
def test_bad_alert_keys_are_refused_by_name(context, message):
    with pytest.raises(StackConfigError, match=message):
        HyperPodConfig.from_context(context, environ={})


def test_alert_emails_from_the_command_line():
    config = HyperPodConfig.from_context({"alert_emails": "a@example.com, b@example.com"}, environ={})
    assert config.alert_emails == ("a@example.com", "b@example.com")
