"""The README's Node.js requirement matches what the pinned CDK CLI (package.json) declares it supports."""

from __future__ import annotations

import json
import re

import pytest

from stacks.build import REPO_ROOT

pytestmark = pytest.mark.xdist_group("infra")


def test_readme_node_versions_satisfy_the_pinned_cdk_cli() -> None:
    pinned = json.loads((REPO_ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    installed = json.loads((REPO_ROOT / "node_modules" / "aws-cdk" / "package.json").read_text())
    assert installed["version"] == pinned, "node_modules is stale: run `make venv`"
    engines = re.fullmatch(r">=\s*(\d+)\.\d+\.\d+", installed["engines"]["node"].strip())
    assert engines, f"unexpected engines range {installed['engines']['node']!r}: update this test"
    minimum = int(engines.group(1))

    readme = (REPO_ROOT / "README.md").read_text()
    stated = re.search(r"Node\.js (\d+)(?: or (\d+))?, make and git", readme)
    assert stated, "the README's quick start must state the Node.js versions"
    versions = [int(v) for v in stated.groups() if v]
    assert all(version >= minimum for version in versions), f"CDK CLI {pinned} needs Node.js >= {minimum}"
    assert f"{pinned}, needs Node.js >= {minimum}" in readme, "the README must name the pin and its minimum"
