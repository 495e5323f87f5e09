"""The test lanes: every module under tests/slurm (each starts a local Slurm) carries the `slurm` marker,
so `make test-fast` (-m "not slurm") leaves out exactly those and `make test` runs them too."""

from __future__ import annotations

import ast
from pathlib import Path

SLURM_TESTS = Path(__file__).parent / "slurm"


def module_marks(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return [ast.unparse(value) for value in values]
    return []


def test_every_slurm_module_carries_the_slurm_marker():
    modules = sorted(SLURM_TESTS.glob("test_*.py"))
    assert len(modules) >= 10
    assert [p.name for p in modules if "pytest.mark.slurm" not in module_marks(p)] == []
