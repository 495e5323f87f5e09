"""Users and teams: the `teams` and `users` context lists, and the users file the nodes read.

    "teams": [{"name": "research", "gid": 3001, "fairshare": 3, "max_nodes": 4, "max_gpu_minutes": 0}],
    "users": [{"name": "alice", "uid": 3101, "team": "research", "ssh_public_key": "ssh-ed25519 AAAA... alice"}]

A team is a Linux group (same gid on every node), a Slurm account with its fair-share weight and a QOS
with its limits; a user is a Linux account (same uid on every node, home and outputs folder on FSx) in
their team's account. No ssh key: the user reaches the cluster through SSM only (`hpctl shell`, then
`sudo -iu <name>`). Every error names the list, the entry and the key, e.g. ``users[1] (bob).uid``.
The lifecycle reads the generated file (lifecycle/slurm_teams.py, USERS_FILE next to the script).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from lifecycle.slurm_teams import SSH_KEY
from stacks.validation import StackConfigError, describe, entry_where, json_context

TEAMS_KEY, USERS_KEY = "teams", "users"
# Linux names: lowercase, start with a letter; Slurm accounts take the same. Not names the AMI or
# Debian already use for system accounts or groups.
NAME = re.compile(r"[a-z][a-z0-9_-]{0,30}")
RESERVED_NAMES = ("root", "ubuntu", "slurm", "munge", "admin", "sudo", "docker", "nobody", "users", "ssm-user")
# Regular accounts' ids on Debian/Ubuntu (login.defs UID_MIN..UID_MAX), above HyperPod's ubuntu (1000).
ID_MIN, ID_MAX = 2000, 59999


@dataclass(frozen=True)
class Team:
    """One team: a Linux group, a Slurm account with a fair-share weight, and a QOS with its limits."""

    name: str = field(metadata=describe("the group, the Slurm account and (with -qos) the QOS name"))
    gid: int = field(metadata=describe(f"the group's id on every node, {ID_MIN} to {ID_MAX}"))
    fairshare: int = field(default=1, metadata=describe("the team's fair-share weight (Slurm account Fairshare)"))
    max_nodes: int = field(default=0, metadata=describe("most nodes one job may use (QOS MaxTRESPerJob); 0: no limit"))
    max_gpu_minutes: int = field(
        default=0, metadata=describe("GPU-minutes the team may use in all (QOS GrpTRESMins=gres/gpu); 0: no limit")
    )


@dataclass(frozen=True)
class User:
    """One person: a Linux account with a fixed uid in their team's group and Slurm account."""

    name: str = field(metadata=describe("login name and Slurm user"))
    uid: int = field(metadata=describe(f"the user's id on every node, {ID_MIN} to {ID_MAX}"))
    team: str = field(metadata=describe("a name from teams: the group, account and QOS the user's jobs run under"))
    ssh_public_key: str = field(default="", metadata=describe("an OpenSSH public key line; empty: SSM only"))


def _error(key: str, where: str, name: str, allowed: str, value: Any) -> StackConfigError:
    return StackConfigError(
        f"config key '{key}' entry {where}, key '{name}' has value {value!r}; allowed: {allowed}. "
        f"Fix it in cdk.json (context) or pass -c {key}='<JSON list>'."
    )


def _parse(key: str, cls: type, raw: Any) -> tuple:
    raw = json_context(key, raw)
    if not isinstance(raw, list):
        raise StackConfigError.bad_value(key, raw, "a list of objects (docs/teams.md)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    parsed = []
    for index, item in enumerate(raw):
        where = entry_where(index, item)
        if not isinstance(item, dict):
            raise _error(key, where, "-", f"an object with {', '.join(fields)}", item)
        for entry_key, value in item.items():
            if entry_key not in fields:
                raise StackConfigError(
                    f"config key '{key}' entry {where}: unknown key '{entry_key}'; known: {', '.join(fields)}"
                )
            kind = int if fields[entry_key].type == "int" else str
            if type(value) is not kind:
                raise _error(key, where, entry_key, "an integer" if kind is int else "a string", value)
        missing = [f for f, spec in fields.items() if spec.default is dataclasses.MISSING and f not in item]
        if missing:
            raise StackConfigError(
                f"config key '{key}' entry {where} lacks {', '.join(missing)}: every entry names them"
            )
        parsed.append(cls(**item))
    return tuple(parsed)


def parse_teams(raw: Any) -> tuple[Team, ...]:
    return _parse(TEAMS_KEY, Team, raw)


def parse_users(raw: Any) -> tuple[User, ...]:
    return _parse(USERS_KEY, User, raw)


def check_teams(teams: tuple[Team, ...], users: tuple[User, ...]) -> None:
    """Names and ids valid and unique, each user's team defined."""
    for key, entries, id_key in ((TEAMS_KEY, teams, "gid"), (USERS_KEY, users, "uid")):
        seen: dict[tuple[str, Any], int] = {}
        for index, entry in enumerate(entries):
            where = f"[{index}] ({entry.name})"
            if not NAME.fullmatch(entry.name) or entry.name in RESERVED_NAMES:
                allowed = "a lowercase letter, then up to 30 lowercase letters, digits, _ or -; not a system name"
                raise _error(key, where, "name", allowed, entry.name)
            ident = getattr(entry, id_key)
            if not ID_MIN <= ident <= ID_MAX:
                raise _error(key, where, id_key, f"an integer from {ID_MIN} to {ID_MAX}", ident)
            for unique in ("name", id_key):
                value = getattr(entry, unique)
                if (unique, value) in seen:
                    other = seen[(unique, value)]
                    raise _error(key, where, unique, f"a {unique} no other entry uses ([{other}] has it)", value)
                seen[(unique, value)] = index
    team_names = {team.name for team in teams}
    for index, team in enumerate(teams):
        for number in ("fairshare", "max_nodes", "max_gpu_minutes"):
            low = 1 if number == "fairshare" else 0
            if getattr(team, number) < low:
                raise _error(
                    TEAMS_KEY, f"[{index}] ({team.name})", number, f"an integer of {low} or more", getattr(team, number)
                )
    names = {user.name for user in users}
    for index, user in enumerate(users):
        where = f"[{index}] ({user.name})"
        if user.team not in team_names:
            allowed = f"a team named in config key '{TEAMS_KEY}' ({', '.join(sorted(team_names)) or 'none defined'})"
            raise _error(USERS_KEY, where, "team", allowed, user.team)
        if user.ssh_public_key and not SSH_KEY.fullmatch(user.ssh_public_key):
            raise _error(USERS_KEY, where, "ssh_public_key", "one OpenSSH public key line (ssh-ed25519 AAAA...)", "...")
    clash = names & team_names
    if clash:
        raise StackConfigError(
            f"config keys 'users' and 'teams' share the name {sorted(clash)[0]!r}: a user and a team need two names"
        )


def users_file(teams: Any, users: Any) -> dict:
    """The users file (lifecycle/slurm_teams.py USERS_FILE) from the context lists or parsed entries."""
    parsed_teams = teams if all(isinstance(t, Team) for t in teams) else parse_teams(teams)
    parsed_users = users if all(isinstance(u, User) for u in users) else parse_users(users)
    check_teams(parsed_teams, parsed_users)
    return {
        "teams": [dataclasses.asdict(team) for team in parsed_teams],
        "users": [dataclasses.asdict(user) for user in parsed_users],
    }
