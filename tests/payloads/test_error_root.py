"""One error root: every exception class of the payload package derives from PipelineError, so each
entry point catches it once (a class it does not know cannot slip past as a traceback)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from llm_pipeline.errors import PipelineError

PACKAGE = Path(__file__).parents[2] / "payloads" / "llm_pipeline"
# A termination signal unwinding the stack (weights/atomic_output.py): an Exception root would let
# `except Exception` swallow it, so it stays a BaseException on purpose.
SIGNALS = {"llm_pipeline.weights.atomic_output.Interrupted"}


def exception_classes() -> list[str]:
    """module.Class of every class whose name or bases say exception, read from the syntax trees."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(base) for base in node.bases]
            if node.name.endswith(("Error", "Exception")) or any(b.endswith(("Error", "Exception")) for b in bases):
                found.append(f"{module}.{node.name}")
    return found


def test_every_exception_class_of_the_package_derives_from_pipeline_error():
    names = [name for name in exception_classes() if name not in SIGNALS]
    assert len(names) >= 9  # the reader sees them all
    outside = []
    for name in names:
        module, _, attribute = name.rpartition(".")
        if not issubclass(getattr(importlib.import_module(module), attribute), PipelineError):
            outside.append(name)
    assert outside == []


def test_each_keeps_the_builtin_base_its_callers_catch():
    from llm_pipeline.config import ConfigError
    from llm_pipeline.errors import StepError
    from llm_pipeline.jobs.launch import LaunchError

    assert issubclass(ConfigError, ValueError) and issubclass(LaunchError, ValueError)
    assert issubclass(StepError, RuntimeError)
