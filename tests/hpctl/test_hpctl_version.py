"""`hpctl --version`, and `--help` texts that say what hpctl does."""

from __future__ import annotations

import pytest

import llm_pipeline
from hpctl.cli import build_parser


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"hpctl {llm_pipeline.__version__}"


@pytest.mark.parametrize("action,default", [("stop", False), ("status", True), ("logs", True)])
def test_job_help_names_a_default_only_where_there_is_one(capsys, action, default):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["job", action, "--help"])
    assert ("(default: newest)" in capsys.readouterr().out) is default
