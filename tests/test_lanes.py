"""The test lanes: every module under tests/slurm (each starts a local Slurm) carries the `slurm` marker,
so `make test-fast` leaves out exactly those (and the rehearsal and engine markers) and `make test` runs them too."""

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


REPO = Path(__file__).resolve().parents[1]


def make_recipe(target: str) -> str:
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    return "\n".join(line for line in lines[start + 1 :] if line.startswith("\t")).split("\n\n")[0]


def test_test_fast_leaves_out_exactly_the_markers_that_say_so_and_make_test_runs_all():
    import tomllib

    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    left_out = sorted(m.split(":", 1)[0] for m in markers if "make test-fast does not" in m)
    assert left_out == ["engine", "rehearsal"]
    assert f'-m "not slurm and not {left_out[1]} and not {left_out[0]}"' in make_recipe("test-fast")
    assert '-m "engine and not slurm and not rehearsal"' in make_recipe("test-engine")
    first = make_recipe("test").splitlines()[0].split("#")[0].split()
    assert first[:3] == ["$(PY)", "-m", "pytest"] and "-m" not in first[3:], "make test (CI) runs all"


class Item:
    """What tests/conftest.py's ordering reads of a collected test: its file and markers."""

    def __init__(self, path: str, *marks: str) -> None:
        self.path, self.marks = Path(path), marks

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None

    def __repr__(self) -> str:
        return f"{self.path}{list(self.marks)}"


def test_the_heaviest_modules_are_handed_out_first_and_stay_whole():
    """Longest first under xdist: rehearsals, then the other local-Slurm tests, engine runs, the grouped
    modules, the rest; a module moves whole (its heaviest test decides), each class in collection order."""
    import types

    from tests import conftest

    fast, slurm, engine, rehearsal = (
        Item("a.py"),
        Item("b.py", "slurm"),
        Item("c.py", "engine"),
        Item("d.py", "rehearsal"),
    )
    mixed = [Item("e.py"), Item("e.py", "rehearsal")]
    grouped, slurm2 = Item("f.py", "xdist_group"), Item("b.py", "slurm")
    items = [fast, slurm, slurm2, engine, grouped, rehearsal, *mixed]
    conftest.pytest_collection_modifyitems(types.SimpleNamespace(), items)
    assert items == [rehearsal, *mixed, slurm, slurm2, engine, grouped, fast]

    config = types.SimpleNamespace(option=types.SimpleNamespace(dist="loadgroup", loadscopereorder=True))
    conftest.pytest_configure(config)
    assert config.option.loadscopereorder is False  # xdist keeps that order instead of sorting by size
