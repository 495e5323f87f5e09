"""The lifecycle folder as uploaded to S3: lint-clean shell, a Python 3.10 helper, no legacy config."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from lifecycle_node import LIFECYCLE_DIR

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def shell_scripts() -> list[Path]:
    found = [
        path
        for path in LIFECYCLE_DIR.rglob("*")
        if path.is_file() and (path.suffix == ".sh" or path.read_bytes().startswith(b"#!/usr/bin/env bash"))
    ]
    assert LIFECYCLE_DIR / "on_init_complete.sh" in found
    return found


def test_shellcheck_clean() -> None:
    done = subprocess.run(
        [str(SHELLCHECK), "--severity=style", *map(str, shell_scripts())], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_entry_point_is_executable_bash() -> None:
    script = LIFECYCLE_DIR / "on_init_complete.sh"
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env bash\n")


def test_no_provisioning_parameters_file() -> None:
    # HyperPod rejects a cluster with API-driven Slurm config if this legacy file is under SourceS3Uri.
    names = [path.name.lower() for path in LIFECYCLE_DIR.rglob("*")]
    assert "provisioning_parameters.json" not in names


def test_helper_parses_as_python_3_10() -> None:
    # The HyperPod Slurm AMI's python3 is 3.10: the helper must not need newer syntax.
    source = (LIFECYCLE_DIR / "node_facts.py").read_text()
    ast.parse(source, feature_version=(3, 10))
    assert "tomllib" not in source


def test_fact_keys_copy_equals_the_contract() -> None:
    """lifecycle/ ships alone, so node_facts.py keeps a copy of cluster_contract.FACT_KEYS."""
    import cluster_contract

    tree = ast.parse((LIFECYCLE_DIR / "node_facts.py").read_text())
    (copy,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FACT_KEYS" for t in node.targets)
    ]
    assert copy == cluster_contract.FACT_KEYS, (
        "lifecycle/node_facts.py FACT_KEYS differs from cluster_contract.FACT_KEYS: copy the tuple over"
    )
