"""hpctl submit on a cluster with teams: the chain as a named user, under an account asked for."""

from __future__ import annotations

import json
import shlex

import pytest

from hpctl.cli import main
from hpctl.common.cluster_users import check_cluster_user
from hpctl.common.errors import HpctlError
from hpctl.runs.submit import SubmitOptions, remote_command

FACTS = {"payloads_dir": "/fsx/payloads", "default_user": "ubuntu"}


def test_submit_runs_as_the_named_user_under_the_named_account():
    command = shlex.split(remote_command(SubmitOptions(config="c.toml", account="research", user="alice"), facts=FACTS))
    assert command[:4] == ["sudo", "-n", "-u", "alice"]
    assert "llm_pipeline.submit --config c.toml --account research;" in command[-1]
    default = shlex.split(remote_command(SubmitOptions(config="c.toml"), facts=FACTS))
    assert default[3] == "ubuntu" and "--account" not in default[-1]


def test_an_account_with_the_sweep_is_refused_in_one_line(capsys):
    code = main(["submit", "--config", "tiny", "--sweep", "1,2", "--account", "research", "--dry-run"])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err == "error: --account applies to the pipeline and the ladder: the sweep runs under the user's team\n"
    )


def test_as_user_must_be_a_configured_user(tmp_path):
    teams = [{"name": "research", "gid": 3001}]
    users = [{"name": "alice", "uid": 3101, "team": "research"}]
    (tmp_path / "cdk.json").write_text(json.dumps({"context": {"teams": teams, "users": users}}))
    check_cluster_user("alice", tmp_path)
    with pytest.raises(HpctlError, match=r"^--as-user mallory: not a user in cdk.json \(users: alice\); add them"):
        check_cluster_user("mallory", tmp_path)
