"""The `hpctl doctor`, `wait` and `shell` commands, and the room's registration (update-software, secret too)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctl.cluster import secrets, software
from hpctl.cluster.wait import wait_in_service
from hpctl.common import ssm
from hpctl.common.arguments import positive
from hpctl.common.deployment import connect, session_request
from hpctl.common.project import read_cdk_context, resolve_settings
from hpctl.common.registry import Room, RoomCommands


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    doctor_parser = sub.add_parser(
        "doctor",
        parents=[common],
        help="before a deploy: credentials, region, quotas, zone, Docker, Node.js, CDK, token",
    )
    doctor_parser.set_defaults(handler=doctor)

    wait_parser = sub.add_parser("wait", parents=[common], help="wait until the cluster is in service (or failed)")
    wait_parser.add_argument(
        "--timeout", type=positive, default=5400, metavar="SECONDS", help="give up after (default 5400)"
    )
    wait_parser.add_argument("--interval", type=positive, default=30, metavar="SECONDS", help="poll every (default 30)")
    wait_parser.set_defaults(handler=wait)

    shell_parser = sub.add_parser("shell", parents=[common], help="SSM shell on the controller (or another node)")
    target = shell_parser.add_mutually_exclusive_group()
    target.add_argument("--node", metavar="INSTANCE_ID", help="connect to this instance")
    target.add_argument("--group", help="connect to the first running node of this instance group")
    shell_parser.set_defaults(handler=shell)

    software.add_parsers(sub, common)
    secrets.add_parsers(sub, common)


ROOM = Room("cluster", "check, wait for, reach and update the cluster; its secrets", register)


def doctor(args: argparse.Namespace) -> int:
    from hpctl.cluster import (
        doctor as checkup,  # loads stacks.config and cfn-lint's tables: only this command needs them
    )

    settings = resolve_settings(stack=args.stack, region=args.region, cwd=Path.cwd())
    context = read_cdk_context(settings.root) if (settings.root / "cdk.json").is_file() else {}
    if args.region:  # the deploy's region is cdk.json's unless told otherwise
        context = {**context, "region": args.region}
    return checkup.run(context=context, profile=args.profile)


def wait(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster = wait_in_service(
        deployment.session, deployment.settings.stack_name, timeout_s=args.timeout, interval_s=args.interval
    )
    print(f"cluster {cluster.name} is in service: `hpctl shell` opens a shell on the controller")


def shell(args: argparse.Namespace) -> None:
    ssm.find_session_tools()  # fail before any AWS call when the local tools are missing
    deployment = connect(args)
    ssm.exec_session(session_request(deployment, group=args.group, node=args.node, ready=False))
