"""hpctl is installed without stacks/: what it imports must be packaged with it (pyproject.toml)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPENDENCIES = {"boto3", "botocore", "sagemaker"}  # requirements.txt; requirements-sagemaker.txt (hpctl job)


def packaged_top_level_names() -> set[str]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]}
    return packages | set(setuptools.get("py-modules", []))


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_hpctl_imports_only_the_stdlib_its_dependencies_and_packaged_modules():
    allowed = set(sys.stdlib_module_names) | DEPENDENCIES | packaged_top_level_names()
    for path in sorted((ROOT / "hpctl").rglob("*.py")):
        unpackaged = imported_roots(path) - allowed
        assert not unpackaged, (
            f"{path.relative_to(ROOT)} imports {sorted(unpackaged)}, which `pip install .` does not ship"
        )


def test_the_shared_names_module_is_packaged_and_stdlib_only():
    assert "cluster_contract" in packaged_top_level_names()
    assert imported_roots(ROOT / "cluster_contract.py") <= set(sys.stdlib_module_names)
