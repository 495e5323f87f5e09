"""hpctl submit on a cluster with teams: the chain as a named user, under an account asked for."""

from __future__ import annotations

import shlex

from hpctl.cli import main
from hpctl.submit import SubmitOptions, remote_command

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
