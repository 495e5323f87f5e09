"""`hpctl --version` names the project version the payload code carries."""

from __future__ import annotations

import pytest

import llm_pipeline
from hpctl.cli import build_parser


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"hpctl {llm_pipeline.__version__}"
