"""Installed library sources read as syntax trees: where a name is defined, a class's members and
dataclass fields, a function's parameters. Nothing is imported, so optimum-neuron's training classes
(which need torch_xla at import) can be checked on a machine without Neuron.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SITE_PACKAGES = Path(importlib.util.find_spec("trl").origin).parents[1]
PAYLOADS = Path(__file__).resolve().parents[2] / "payloads"


@dataclass(frozen=True)
class Definition:
    """A name's definition: a class, a function or an assignment in `module` (node None: a module)."""

    module: str
    node: ast.AST | None

    @property
    def name(self) -> str:
        if isinstance(self.node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            return self.node.name
        return self.module


@dataclass(frozen=True)
class Parameters:
    positional: tuple[str, ...]
    keyword_only: tuple[str, ...]
    varargs: bool
    varkw: str | None

    @property
    def names(self) -> set[str]:
        return set(self.positional) | set(self.keyword_only)


def module_path(module: str) -> Path | None:
    for root in (SITE_PACKAGES, PAYLOADS):
        base = root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


@cache
def module_tree(module: str) -> ast.Module | None:
    path = module_path(module)
    return ast.parse(path.read_text(), str(path)) if path else None


def _statements(body):
    """Module-level statements, including those under `if`/`try` (TYPE_CHECKING, optional imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _statements(part)


def absolute_module(module: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    if module_path(module) and module_path(module).name != "__init__.py":
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def resolve(module: str, name: str, depth: int = 0) -> Definition | None:
    """Follow imports from `module` to where `name` is defined (first definition in source order)."""
    tree = module_tree(module)
    if tree is None or depth > 20:
        return None
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    target = absolute_module(module, node.level, node.module)
                    found = resolve(target, alias.name, depth + 1)
                    if found:
                        return found
                    if module_path(f"{target}.{alias.name}"):
                        return Definition(f"{target}.{alias.name}", None)
        elif (isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name) or (
            isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        ):
            return Definition(module, node)
    return None


def _expr_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _type_call(node: ast.AST) -> ast.Call | None:
    """`X = type("X", (Bases,), Other.__dict__.copy())`, the way optimum-neuron builds _SFTTrainer."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _expr_name(node.value.func) == "type":
        return node.value
    return None


def class_mro(cls: Definition) -> list[Definition]:
    """Class definitions whose bodies are searched for members, most derived first."""
    order: list[Definition] = []
    call = _type_call(cls.node)
    if isinstance(cls.node, ast.ClassDef):
        order.append(cls)
        bases = cls.node.bases
    elif call is not None and len(call.args) == 3:
        namespace = call.args[2]
        while isinstance(namespace, (ast.Call, ast.Attribute)):
            namespace = namespace.func if isinstance(namespace, ast.Call) else namespace.value
        source = resolve(cls.module, namespace.id) if isinstance(namespace, ast.Name) else None
        if source is not None:
            order.append(source)  # its own body only: type() copies that class's __dict__
        bases = call.args[1].elts if isinstance(call.args[1], ast.Tuple) else []
    else:
        return order
    for base in bases:
        name = _expr_name(base)
        found = resolve(cls.module, name) if name else None
        for entry in class_mro(found) if found else []:
            if entry not in order:
                order.append(entry)
    return order


def _self_assigned(function: ast.AST, name: str) -> ast.AST | None:
    for node in ast.walk(function):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and target.attr == name
            ):
                return node
    return None


def member(cls: Definition, name: str) -> tuple[Definition, ast.AST] | None:
    """(owning class, node) for a method, class attribute, field or `self.<name> =` assignment."""
    for owner in class_mro(cls):
        for node in owner.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return owner, node
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return owner, node
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return owner, node
        for node in owner.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (found := _self_assigned(node, name)):
                return owner, found
    return None


def has_unreadable_base(cls: Definition) -> bool:
    """Whether some base class is not in the sources (a builtin such as RuntimeError, or a C type)."""
    for owner in class_mro(cls):
        for base in owner.node.bases:
            name = _expr_name(base)
            if name in (None, "object"):
                continue
            if resolve(owner.module, name) is None:
                return True
    return False


def is_dataclass(cls: Definition) -> bool:
    return any(
        _expr_name(d.func if isinstance(d, ast.Call) else d) == "dataclass"
        for owner in class_mro(cls)
        for d in owner.node.decorator_list
    )


def dataclass_fields(cls: Definition) -> set[str]:
    fields = set()
    for owner in class_mro(cls):
        for node in owner.node.body:
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and "ClassVar" not in ast.unparse(node.annotation)
            ):
                fields.add(node.target.id)
    return fields


def parameters(function: ast.FunctionDef, *, bound: bool) -> Parameters:
    """The parameters a caller can pass; `bound` drops self/cls."""
    args = function.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if bound and not any(_expr_name(d) == "staticmethod" for d in function.decorator_list):
        positional = positional[1:]
    return Parameters(
        tuple(positional),
        tuple(a.arg for a in args.kwonlyargs),
        args.vararg is not None,
        args.kwarg.arg if args.kwarg else None,
    )


def keys_read_from_kwargs(function: ast.FunctionDef) -> set[str]:
    """String keys the function takes out of its **kwargs (`kwargs.pop("x")`, `kwargs.get("x")`)."""
    varkw = function.args.kwarg.arg if function.args.kwarg else None
    keys = set()
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("pop", "get")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == varkw
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            keys.add(node.args[0].value)
    return keys


def forwards_kwargs_to(function: ast.FunctionDef, method: str) -> bool:
    """Whether the body calls `<something>.<method>(..., **kwargs)` with its own **kwargs."""
    varkw = function.args.kwarg.arg if function.args.kwarg else None
    return any(
        isinstance(node, ast.Call)
        and _expr_name(node.func) == method
        and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == varkw for k in node.keywords)
        for node in ast.walk(function)
    )
