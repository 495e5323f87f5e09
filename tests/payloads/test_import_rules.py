"""Each payload subpackage imports only what its ``__init__`` says it may (read from the syntax trees,
imports inside functions included), and no training engine imports another engine's modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "payloads" / "llm_pipeline"
ENGINES = ("neuron", "torch", "torchtitan")
TRAINING_STACK = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "safetensors", "numpy"}
TOP_LEVEL_SHARED = {
    "llm_pipeline.config",
    "llm_pipeline.errors",
    "llm_pipeline.prompt",
    "llm_pipeline.model_shapes",
    "llm_pipeline.jobs.prom_textfile",  # stdlib only: the run's figures for node exporter, written by every engine
    "llm_pipeline.run_files",
    "llm_pipeline.refusals",  # stdlib only: the one table of device and backend refusals
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from llm_pipeline.training import plan` imports llm_pipeline.training.plan
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _ours(name: str) -> bool:
    return name == "llm_pipeline" or name.startswith("llm_pipeline.")


def _within(name: str, allowed_prefixes: set[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in allowed_prefixes)


def _modules(folder: Path, recursive: bool = False) -> list[Path]:
    return sorted(folder.rglob("*.py") if recursive else folder.glob("*.py"))


def _violations(path: Path, allowed_ours: set[str], allowed_third_party: set[str]) -> list[str]:
    problems = []
    for name in sorted(imported_modules(path)):
        root = name.split(".")[0]
        if _ours(name):
            if not _within(name, allowed_ours):
                problems.append(f"{path.relative_to(PACKAGE)} imports {name}")
        elif root not in sys.stdlib_module_names and root not in allowed_third_party:
            problems.append(f"{path.relative_to(PACKAGE)} imports {name} (third party)")
    return problems


def _engine_allowed(engine: str) -> set[str]:
    shared = {f"llm_pipeline.training.{p.stem}" for p in _modules(PACKAGE / "training") if p.stem != "__init__"}
    return TOP_LEVEL_SHARED | shared | {f"llm_pipeline.training.{engine}"}


def test_the_training_room_holds_one_folder_per_engine_and_the_shared_modules():
    folders = sorted(p.name for p in (PACKAGE / "training").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(ENGINES)
    for engine in ENGINES:
        assert "May import" in (PACKAGE / "training" / engine / "__init__.py").read_text()


def test_shared_training_modules_import_no_engine_and_no_step():
    allowed = TOP_LEVEL_SHARED | {"llm_pipeline.training", "llm_pipeline.weights.checkpoints"}
    problems = []
    for path in _modules(PACKAGE / "training"):
        problems += _violations(path, allowed, TRAINING_STACK)
        problems += [f"{path.name} imports {n}" for n in imported_modules(path) if _engine_of(n)]
    assert problems == []


def _engine_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] == ["llm_pipeline", "training"] and len(parts) > 2 and parts[2] in ENGINES:
        return parts[2]
    return None


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_imports_only_the_shared_room_and_itself(engine):
    extra_ours = {
        # resume reads a checkpoint through the same code the consolidate step runs
        "neuron": {"llm_pipeline.weights", "llm_pipeline.consolidate"},
        "torch": set(),
        "torchtitan": set(),
    }[engine]
    third_party = (
        TRAINING_STACK
        | {
            "neuron": {"optimum", "torch_xla"},
            "torch": {"bitsandbytes", "liger_kernel"},
            "torchtitan": {"torchtitan", "torchao", "tomllib", "huggingface_hub"},
        }[engine]
    )
    problems = []
    for path in _modules(PACKAGE / "training" / engine, recursive=True):
        problems += _violations(path, _engine_allowed(engine) | extra_ours, third_party)
    assert problems == []


def test_no_engine_imports_another_engine():
    crossings = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for engine in ENGINES
        for path in _modules(PACKAGE / "training" / engine, recursive=True)
        for name in imported_modules(path)
        if _engine_of(name) not in (None, engine)
    ]
    assert crossings == []


def test_weights_import_no_training_stack():
    # run_files (stdlib only) owns the checkpoint folder's name; run_lock (stdlib only) tells a live process
    allowed = {"llm_pipeline.errors", "llm_pipeline.model_shapes", "llm_pipeline.run_files", "llm_pipeline.weights"}
    allowed |= {"llm_pipeline.jobs.run_lock"}
    problems = []
    for path in _modules(PACKAGE / "weights"):
        problems += _violations(path, allowed, {"numpy", "safetensors", "torch"})
    assert problems == []


def test_jobs_import_the_stdlib_only():
    allowed = {"llm_pipeline.config", "llm_pipeline.errors", "llm_pipeline.jobs", "llm_pipeline.run_files"}
    problems = []
    # The exceptions, each importing boto3 inside the one function that calls AWS, so the rest runs on a bare
    # python3: the capacity scaler (HyperPod's node APIs; claims and releases that scale nothing need none) and
    # the alerts' publisher (SNS, only where the stack set a topic).
    sdk_users = {"capacity.py": {"boto3", "botocore"}, "alerts.py": {"boto3"}}  # botocore: the errors boto3 raises
    for path in _modules(PACKAGE / "jobs"):
        problems += _violations(path, allowed, sdk_users.get(path.name, set()))
    assert problems == []


def test_the_rule_reader_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from llm_pipeline.training.torch import backend\n")
    assert imported_modules(module) == {"llm_pipeline.training.torch.backend"}
    assert _engine_of("llm_pipeline.training.torch.backend") == "torch"


def test_the_run_files_module_imports_the_stdlib_only():
    assert _violations(PACKAGE / "run_files.py", set(), set()) == []


def test_the_refusal_table_imports_the_stdlib_only():
    assert _violations(PACKAGE / "refusals.py", set(), set()) == []
