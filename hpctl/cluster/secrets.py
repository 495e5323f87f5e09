"""`hpctl secret set hf-token`: the Hugging Face token into the stack's Secrets Manager secret.

The token comes from a hidden prompt (or stdin, for scripts), never from the command line, where
shell history and the process list would keep it; it is sent once to Secrets Manager and printed nowhere.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from cluster_contract import HUB_TOKEN_FIELD, StackOutput
from hpctl.common.deployment import connect
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.registry import RoomCommands
from hpctl.common.stack import describe_stack

SECRETS = {"hf-token": (StackOutput.HF_TOKEN_SECRET_ARN, "Hugging Face token")}


def add_parsers(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    secret = sub.add_parser("secret", help="store a secret the runs read at run time (the Hugging Face token)")
    actions = secret.add_subparsers(dest="secret_command", required=True, metavar="ACTION")
    put = actions.add_parser(
        "set", parents=[common], help="read the value from a hidden prompt (or stdin) and store it in the stack"
    )
    put.add_argument("name", choices=sorted(SECRETS), help="which secret")
    put.set_defaults(handler=set_secret)


def read_value(what: str, stdin=None) -> str:
    """From a hidden prompt at a terminal, else all of stdin; one word, never empty."""
    stdin = stdin or sys.stdin
    value = getpass.getpass(f"{what} (input hidden): ") if stdin.isatty() else stdin.read()
    value = value.strip()
    if not value:
        raise HpctlError(f"no {what} given: type it at the prompt, or pipe it in (`hpctl secret set ... < file`)")
    if any(character.isspace() for character in value):
        raise HpctlError(f"the {what} holds whitespace: give the token alone")
    return value


def set_secret(args: argparse.Namespace) -> None:
    output, what = SECRETS[args.name]
    deployment = connect(args)
    stack = describe_stack(deployment.session, deployment.settings.stack_name)
    arn = stack.output(output)
    if not arn:
        raise HpctlError(f"stack {stack.name} has no output {output}: deploy the current version (`make deploy`)")
    value = read_value(what)
    with aws_errors(f"store the {what} in {arn}"):
        reply = deployment.session.client("secretsmanager").put_secret_value(
            SecretId=arn, SecretString=json.dumps({HUB_TOKEN_FIELD: value})
        )
    print(f"stored the {what} in {arn} (version {reply['VersionId']}); the download step reads it at run time")
