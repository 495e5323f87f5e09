"""One error root on the infrastructure side: app.py catches StackError alone, every error class stacks/ defines
derives from it, and no two error classes of the project share a name (the payload's ConfigError is the run
config's; cdk.json's is StackConfigError)."""

from __future__ import annotations

import ast
import collections
import importlib
from pathlib import Path

from stacks.validation import StackError

ROOT = Path(__file__).parents[2]


def _error_classes(folder: str) -> list[tuple[Path, str]]:
    return [
        (path, node.name)
        for path in (ROOT / folder).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Error")
    ]


def test_app_catches_one_class():
    handlers = [n for n in ast.walk(ast.parse((ROOT / "app.py").read_text())) if isinstance(n, ast.ExceptHandler)]
    assert [ast.unparse(handler.type) for handler in handlers] == ["StackError"]


def test_every_stack_error_is_a_stack_error():
    found = _error_classes("stacks")
    assert len(found) >= 3
    for path, name in found:
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        assert issubclass(getattr(module, name), StackError), name


def test_no_two_error_classes_share_a_name():
    names = collections.Counter(
        name for folder in ("stacks", "hpctl", "payloads") for _, name in _error_classes(folder)
    )
    assert [name for name, count in names.items() if count > 1] == []
