"""The users and teams of this checkout's cdk.json, as the nodes get them (stacks/teams.py's users file)."""

from __future__ import annotations

from pathlib import Path

from hpctl.common.errors import HpctlError
from hpctl.common.project import read_cdk_context
from stacks.teams import TEAMS_KEY, USERS_KEY, users_file
from stacks.validation import StackConfigError


def configured(root: Path) -> dict:
    """The users file of this checkout's cdk.json (teams and users)."""
    context = read_cdk_context(root)
    try:
        return users_file(context.get(TEAMS_KEY, []), context.get(USERS_KEY, []))
    except StackConfigError as error:
        raise HpctlError(str(error)) from None


def check_cluster_user(name: str, root: Path) -> None:
    """submit --as-user must name a cdk.json user: the nodes have no account for any other name."""
    names = [user["name"] for user in configured(root)["users"]]
    if name not in names:
        raise HpctlError(
            f"--as-user {name}: not a user in cdk.json (users: {', '.join(names) or 'none'}); add them (docs/teams.md)"
        )
