"""Push alerts: one SNS topic (encrypted with a key of its own) that HyperPod's cluster events and the runs' state
changes reach, with e-mail subscriptions from cdk.json (``alert_emails``).

HyperPod sends its events to EventBridge's default bus (source ``aws.sagemaker``; continuous provisioning only).
Three of its detail-types matter at night, each matched for this cluster by name:

- ``SageMaker HyperPod Cluster Node Health Event``: the health agent found a node unhealthy (reason, repair action);
- ``SageMaker HyperPod Cluster Event`` at level Warn or Error (capacity shortfalls, lifecycle-script failures,
  failed replacements), and every instance-replacement event whatever its level;
- ``SageMaker HyperPod Cluster State Change`` to Failed or RollingBack.

The run side (llm_pipeline.jobs.alerts, on the nodes) publishes a run's finished, failed, NaN stop and stalled
states; the node role may publish to this topic only (:meth:`AlertsTopic.publish_statements`).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

EVENT_SOURCE = "aws.sagemaker"
NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
CLUSTER_EVENT = "SageMaker HyperPod Cluster Event"
CLUSTER_STATE = "SageMaker HyperPod Cluster State Change"
ALERT_LEVELS = ("Warn", "Error")  # of a cluster event's EventLevel (Info | Warn | Error)
REPLACEMENT_DESCRIPTION = "*instance replacement*"  # HyperPod's replacement events, started to failed, at any level
FAILED_CLUSTER_STATES = ("Failed", "RollingBack")
EVENTS_SERVICE = "events.amazonaws.com"
# What a publisher to a KMS-encrypted topic needs on the key (SNS encrypts each message with a data key).
PUBLISH_KEY_ACTIONS = ["kms:GenerateDataKey", "kms:Decrypt"]


def event_patterns(cluster_name: str) -> dict[str, events.EventPattern]:
    """The rules' patterns by construct id, each for ``cluster_name`` only."""

    def event(detail_type: str, detail: dict) -> events.EventPattern:
        return events.EventPattern(source=[EVENT_SOURCE], detail_type=[detail_type], detail=detail)

    return {
        "NodeHealth": event(NODE_HEALTH, {"ClusterName": [cluster_name]}),
        "ClusterEvents": event(
            CLUSTER_EVENT, {"EventDetails": {"ClusterName": [cluster_name], "EventLevel": list(ALERT_LEVELS)}}
        ),
        "NodeReplacements": event(
            CLUSTER_EVENT,
            {"EventDetails": {"ClusterName": [cluster_name], "Description": [{"wildcard": REPLACEMENT_DESCRIPTION}]}},
        ),
        "ClusterFailed": event(
            CLUSTER_STATE, {"ClusterName": [cluster_name], "ClusterStatus": list(FAILED_CLUSTER_STATES)}
        ),
    }


class AlertsTopic(Construct):
    """The topic, its key, the e-mail subscriptions and the EventBridge rules that feed it."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str, emails: Sequence[str]) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "Key",
            description=f"Encrypts the alerts topic of {cluster_name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # EventBridge delivers to an encrypted topic only when the key lets it make data keys; held to this account.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="EventBridgeOfThisAccount",
                principals=[iam.ServicePrincipal(EVENTS_SERVICE)],
                actions=PUBLISH_KEY_ACTIONS,
                resources=["*"],  # in a key policy, "*" is this key
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            display_name=f"{cluster_name} alerts",
            master_key=self.key,
            enforce_ssl=True,
        )
        for email in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        for rule_id, pattern in event_patterns(cluster_name).items():
            events.Rule(
                self,
                rule_id,
                description=f"HyperPod {rule_id} of {cluster_name} to its alerts topic",
                event_pattern=pattern,
                targets=[targets.SnsTopic(self.topic)],
            )

    @property
    def topic_arn(self) -> str:
        return self.topic.topic_arn

    def publish_statements(self) -> list[iam.PolicyStatement]:
        """sns:Publish on this topic and the key use that publishing needs: nothing else, no other topic."""
        return [
            iam.PolicyStatement(sid="PublishRunAlerts", actions=["sns:Publish"], resources=[self.topic.topic_arn]),
            iam.PolicyStatement(sid="EncryptRunAlerts", actions=PUBLISH_KEY_ACTIONS, resources=[self.key.key_arn]),
        ]
