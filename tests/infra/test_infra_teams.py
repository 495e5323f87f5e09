"""cdk.json `teams` and `users`: validation naming the key, and the users file the nodes read."""

from __future__ import annotations

import json

import pytest

from stacks.config import ConfigError, HyperPodConfig
from stacks.teams import users_file

TEAMS = [{"name": "research", "gid": 3001, "fairshare": 3}, {"name": "product", "gid": 3002, "max_nodes": 2}]
USERS = [{"name": "alice", "uid": 3101, "team": "research"}, {"name": "bob", "uid": 3201, "team": "product"}]


def parse(**context: object) -> HyperPodConfig:
    return HyperPodConfig.from_context(context, environ={})


def test_teams_and_users_parse_from_lists_and_from_json_text():
    config = parse(teams=TEAMS, users=json.dumps(USERS))
    spec = users_file(config.teams, config.users)
    assert spec["teams"][0] == {"name": "research", "gid": 3001, "fairshare": 3, "max_nodes": 0, "max_gpu_minutes": 0}
    assert [user["name"] for user in spec["users"]] == ["alice", "bob"]
    assert users_file([], []) == {"teams": [], "users": []}


@pytest.mark.parametrize(
    ("users", "teams", "message"),
    [
        ([{**USERS[0], "team": "sales"}], TEAMS, r"'users' entry \[0\] \(alice\), key 'team' has value 'sales'"),
        ([USERS[0], {**USERS[1], "uid": 3101}], TEAMS, r"'users' entry \[1\] \(bob\), key 'uid' .*\[0\] has it"),
        ([USERS[0], {**USERS[1], "name": "alice"}], TEAMS, r"'users' entry \[1\] \(alice\), key 'name'"),
        ([{**USERS[0], "uid": 1000}], TEAMS, r"key 'uid' has value 1000; allowed: an integer from 2000 to 59999"),
        ([{**USERS[0], "name": "root"}], TEAMS, r"key 'name' has value 'root'"),
        ([{**USERS[0], "ssh_public_key": "not a key"}], TEAMS, r"key 'ssh_public_key'"),
        ([{**USERS[0], "shell": "zsh"}], TEAMS, r"'users' entry \[0\] \(alice\): unknown key 'shell'"),
        ([{"name": "alice", "team": "research"}], TEAMS, r"'users' entry \[0\] \(alice\) lacks uid"),
        (USERS, [TEAMS[0], {**TEAMS[1], "gid": 3001}], r"'teams' entry \[1\] \(product\), key 'gid'"),
        (USERS, [{**TEAMS[0], "fairshare": 0}, TEAMS[1]], r"key 'fairshare' has value 0"),
        ([{**USERS[0], "uid": "3101"}], TEAMS, r"key 'uid' has value '3101'; allowed: an integer"),
    ],
)
def test_a_bad_user_or_team_names_the_key(users, teams, message):
    with pytest.raises(ConfigError, match=message):
        parse(teams=teams, users=users)
