"""Secrets the runs need, kept in AWS Secrets Manager under a key of the stack's own: the Hugging Face token.

The stack creates the secret with no token in it (``{"token": ""}`` plus a generated filler, so no
value is ever written in the template); `hpctl secret set hf-token` puts the token in from a hidden
prompt or stdin. The download step reads it at run time with the node role or the job role
(llm_pipeline/hub_token.py), which may read this one secret and decrypt with this one key, only
through Secrets Manager.

Only those roles can read it (:meth:`HubTokenSecret.restrict_reads`): the secret's resource policy denies
GetSecretValue to every other principal of the account, however broad its own IAM policy, and the key's policy
denies Decrypt to any call that does not come through Secrets Manager (kms:ViaService). Writing the token
(`hpctl secret set`: PutSecretValue) and DescribeSecret (whether it was set, for `hpctl doctor`) stay with IAM.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from cluster_contract import HUB_TOKEN_FIELD
from stacks.nag import acknowledge

READ_ACTION = "secretsmanager:GetSecretValue"


def secret_key(scope: Construct, description: str) -> kms.Key:
    """A customer-managed key for a secret, rotated yearly, gone a week after the stack (nothing billable left)."""
    return kms.Key(
        scope,
        "Key",
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=Duration.days(7),
    )


class HubTokenSecret(Construct):
    """The Hugging Face token's secret and its customer-managed KMS key (rotated yearly)."""

    def __init__(self, scope: Construct, construct_id: str, *, name_prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.key = secret_key(self, f"Encrypts the {name_prefix} Hugging Face token secret")
        self.secret = secretsmanager.Secret(
            self,
            "Secret",
            description=f"Hugging Face token for {name_prefix} runs: set with `hpctl secret set hf-token`",
            encryption_key=self.key,
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template=f'{{"{HUB_TOKEN_FIELD}": ""}}', generate_string_key="unset"
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )
        acknowledge(
            self.secret,
            "AwsSolutions-SMG4",
            "A Hugging Face access token is issued by the Hub, not by AWS: no rotation Lambda can mint a new "
            "one; the user replaces it with `hpctl secret set hf-token`.",
        )

    def restrict_reads(self, readers: list[iam.IRole]) -> None:
        """Deny reading the token to every principal but ``readers`` (the node role, the job role), and
        decrypting with its key to any call not made through Secrets Manager."""
        self.secret.add_to_resource_policy(
            iam.PolicyStatement(
                sid="OnlyTheRunRolesReadTheToken",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=[READ_ACTION],
                resources=["*"],  # in a secret's policy, "*" is the secret itself
                conditions={"ArnNotEquals": {"aws:PrincipalArn": [role.role_arn for role in readers]}},
            )
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DecryptOnlyThroughSecretsManager",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["kms:Decrypt"],
                resources=["*"],  # in a key policy, "*" is the key itself
                conditions={"StringNotEquals": {"kms:ViaService": self._via_secrets_manager()}},
            )
        )

    def _via_secrets_manager(self) -> str:
        return f"secretsmanager.{Stack.of(self).region}.amazonaws.com"

    @property
    def arn(self) -> str:
        return self.secret.secret_arn

    def read_statements(self) -> list[iam.PolicyStatement]:
        """Read this secret and decrypt with its key, the latter only on Secrets Manager's behalf."""
        return [
            iam.PolicyStatement(sid="ReadHubToken", actions=[READ_ACTION], resources=[self.secret.secret_arn]),
            iam.PolicyStatement(
                sid="DecryptHubToken",
                actions=["kms:Decrypt"],
                resources=[self.key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": self._via_secrets_manager()}},
            ),
        ]
