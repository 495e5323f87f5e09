"""On a Node.js older than jsii supports, make says so in one line, and jsii's banner (11 lines printed as Python
bytes every time a process loads the CDK library) stays out of every command make runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_contract import node_verdict

ROOT = Path(__file__).resolve().parents[2]
QUIET_CHECK = 'jsii-check: ; @$(PY) -c "import aws_cdk"'


def make(*args: str, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path, "MAKELEVEL": "0"}
    env.pop("MAKEFLAGS", None)
    env.pop("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", None)
    command = ["make", "--no-print-directory", f"PY={sys.executable}", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def node_stand_in(folder: Path, major: int) -> str:
    """A PATH whose `node` answers the Makefile's version question with ``major``."""
    (folder / "node").write_text(f"#!/bin/sh\necho {major}\n")
    (folder / "node").chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


@pytest.mark.parametrize(("major", "noted"), [(18, True), (20, True), (22, False), (24, False)])
def test_make_notes_an_unsupported_node_once(tmp_path, major, noted):
    done = make("help", path=node_stand_in(tmp_path, major))
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: Node.js")]
    expected = [f"note: {node_verdict(major)[1]}"]
    assert notes == (expected if noted else []), done.stdout


@pytest.mark.parametrize("major", [16, 18, 20, 22, 24])
def test_make_and_doctor_say_the_same_about_node(tmp_path, major):
    """One rule (cluster_contract.node_verdict): make's note is doctor's detail, and doctor fails only where the
    CDK CLI cannot run."""
    from hpctl.cluster.doctor import node as doctor_node

    path = node_stand_in(tmp_path, major)
    # make asks for the major (node -p ...), doctor for the version (node --version)
    (tmp_path / "node").write_text(f'#!/bin/sh\n[ "$1" = -p ] && echo {major} || echo v{major}.1.0\n')
    noted = [line.removeprefix("note: ") for line in make("help", path=path).stdout.splitlines() if "Node.js" in line]
    (finding,) = doctor_node({"PATH": path})
    assert finding.ok == (major >= 18)
    if noted:
        assert finding.detail.endswith(noted[0]), (finding.detail, noted)
    else:
        assert finding.detail == f"v{major}.1.0"


def test_the_cdk_library_loads_without_a_banner_under_make():
    """This machine's real node: whatever its version, loading aws_cdk under make prints nothing."""
    done = make("--eval", QUIET_CHECK, "jsii-check", path=os.environ["PATH"])
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
