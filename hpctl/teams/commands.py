"""The `hpctl users` and `hpctl usage` commands: who is on the cluster, and what each user and team used; the
room's registration."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from cluster_contract import StackOutput
from hpctl.common import run_progress, ssm
from hpctl.common.cluster_users import configured
from hpctl.common.deployment import connect, session_request
from hpctl.common.facts import read_cluster_facts
from hpctl.common.pricing import pricing_client
from hpctl.common.project import resolve_settings
from hpctl.common.registry import Room, RoomCommands
from hpctl.teams import usage

DEFAULT_SINCE = "now-30days"
BEGIN, END = "hpctl-usage-begin", "hpctl-usage-end"


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    users = sub.add_parser("users", help="the cluster's users and teams (cdk.json users, teams)")
    users.add_argument("--json", action="store_true", help="print the users file the nodes read")
    users.set_defaults(handler=list_users)
    used = sub.add_parser(
        "usage", parents=[common], help="node-hours, device-hours and cost per user and team (Slurm accounting)"
    )
    used.add_argument(
        "--since", default=DEFAULT_SINCE, help=f"start of the period, as sacct -S reads it ({DEFAULT_SINCE})"
    )
    used.add_argument(
        "--local", action="store_true", help="run sacct here (on the controller, or against the rehearsal's Slurm)"
    )
    used.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    used.set_defaults(handler=show_usage)


ROOM = Room("teams", "the cluster's users and teams, and what each used", register)


def list_users(args: argparse.Namespace) -> None:
    spec = configured(resolve_settings(stack=None, region=None, cwd=Path.cwd()).root)
    if args.json:
        print(json.dumps(spec, indent=2))
        return
    if not spec["users"]:
        print("no users configured: add `teams` and `users` to cdk.json (docs/teams.md)")
        return
    teams = {team["name"]: team for team in spec["teams"]}
    print(f"{'user':<16} {'uid':>6} {'team (account)':<16} {'share':>5} {'max nodes':>9} {'login':<6}")
    for user in spec["users"]:
        team = teams[user["team"]]
        login = "ssh" if user["ssh_public_key"] else "SSM"
        limit = team["max_nodes"] or "-"
        print(f"{user['name']:<16} {user['uid']:>6} {user['team']:<16} {team['fairshare']:>5} {limit:>9} {login:<6}")


class Collect:
    """Keeps the lines between the markers of the remote sacct call."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.inside = False

    def __call__(self, line: str) -> None:
        if BEGIN in line or END in line:
            self.inside = BEGIN in line
        elif self.inside:
            self.lines.append(line)


def show_usage(args: argparse.Namespace) -> None:
    if args.local:
        totals = usage.summarize(usage.parse(usage.local_sacct(args.since)))
    else:
        ssm.find_session_tools()
        deployment = connect(args)
        facts = read_cluster_facts(deployment.session, deployment.stack().output(StackOutput.BUCKET_NAME))
        sacct = " ".join(usage.sacct_argv(args.since))
        request = session_request(deployment, group=None, node=None, ready=True, command=None)
        collect = Collect()
        command = f"echo {BEGIN}; {sacct}; echo {END}"
        ssm.run_session(dataclasses.replace(request, command=command), collect)
        pricing = pricing_client(deployment.session)
        prices: dict[str, float | None] = {}

        def price_of(instance_type: str) -> float | None:
            if instance_type not in prices:
                found = run_progress.cluster_price(pricing, instance_type, deployment.region)
                prices[instance_type] = found.usd if found else None
            return prices[instance_type]

        totals = usage.summarize(
            usage.parse("\n".join(collect.lines)), partitions=facts["partitions"], price_of=price_of
        )
    if args.json:
        print(json.dumps(totals, indent=2))
    else:
        print(usage.render_text(totals, args.since), end="")
