"""What one of our modules uses from a library, checked against the library's source (api_source).

Collected from our module's syntax tree, not from a hand-kept list: every name imported from the
checked packages, every call to an imported class or function, every method call and attribute use
on a variable whose type is such a class (from a constructor call or an annotation), and the keyword
arguments of those calls, including keys spread in with `**helper(...)` when the helper returns a
dict literal. Anything that cannot be checked is itself reported, so nothing slips through.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import api_source as src

CHECKED_PACKAGES = ("optimum", "trl", "peft", "llm_pipeline")
# Functions that hand their **kwargs on to another one: (module, class, method) -> the receiver.
# For Llama, optimum-neuron's auto class forwards from_pretrained(**kwargs) to the Llama training class.
KWARGS_FORWARDS = {
    ("optimum.neuron.models.training.modeling_auto", "_BaseNeuronModelClass", "from_pretrained"): (
        "optimum.neuron.models.training.llama.modeling_llama",
        "LlamaForCausalLM",
        "from_pretrained",
    ),
}


@dataclass
class Usage:
    module: str
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    problems: list[str] = field(default_factory=list)
    checked_calls: list[str] = field(default_factory=list)  # "Callee(kw1, kw2)" for the test's report
    checked_members: list[str] = field(default_factory=list)  # "Class.attribute" uses that are not calls
    local_functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # the module's own top-level functions

    def problem(self, node: ast.AST, text: str) -> None:
        self.problems.append(f"{self.module}:{getattr(node, 'lineno', '?')}: {text}")


def _collect_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    imports = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in CHECKED_PACKAGES:
            for alias in node.names:
                imports[alias.asname or alias.name] = (node.module, alias.name)
    return imports


def _resolve_import(usage: Usage, local: str) -> src.Definition | None:
    module, name = usage.imports[local]
    return src.resolve(module, name)


def _is_class(definition: src.Definition | None) -> bool:
    return definition is not None and (
        isinstance(definition.node, ast.ClassDef) or src._type_call(definition.node) is not None
    )


def _annotation_class(usage: Usage, annotation: ast.expr | None) -> src.Definition | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.Name) and annotation.id in usage.imports:
        found = _resolve_import(usage, annotation.id)
        return found if _is_class(found) else None
    return None


def _constructed_class(usage: Usage, value: ast.expr) -> src.Definition | None:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in usage.imports:
        found = _resolve_import(usage, value.func.id)
        return found if _is_class(found) else None
    return None


def _calls_api(usage: Usage, value: ast.expr) -> bool:
    """A call whose callee is imported from a checked package (its result type is unknown)."""
    if not isinstance(value, ast.Call):
        return False
    root = value.func
    while isinstance(root, ast.Attribute):
        root = root.value
    return (
        isinstance(root, ast.Name)
        and root.id in usage.imports
        and usage.imports[root.id][0].split(".")[0] != "llm_pipeline"
    )


@dataclass
class Scope:
    types: dict[str, src.Definition] = field(default_factory=dict)  # variable -> class
    untyped: set[str] = field(default_factory=set)  # variables holding an API call's result, type unknown


def _function_scope(usage: Usage, function: ast.FunctionDef, self_types: dict[str, src.Definition]) -> Scope:
    scope = Scope()
    arguments = function.args
    for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        if (cls := _annotation_class(usage, arg.annotation)) is not None:
            scope.types[arg.arg] = cls
    for node in ast.walk(function):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (cls := _annotation_class(usage, node.annotation)) is not None:
                scope.types[node.target.id] = cls
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if (cls := _constructed_class(usage, node.value)) is not None:
                scope.types.setdefault(name, cls)
            elif _calls_api(usage, node.value) and name not in scope.types:
                scope.untyped.add(name)
    for node in ast.walk(function):  # annotations win over "untyped"
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in scope.types:
            scope.untyped.discard(node.target.id)
    scope.types.update({f"self.{name}": cls for name, cls in self_types.items()})
    return scope


def _self_types(usage: Usage, cls: ast.ClassDef) -> dict[str, src.Definition]:
    """`self.x = param` in __init__ where the parameter is annotated with a checked class."""
    found = {}
    for function in cls.body:
        if isinstance(function, ast.FunctionDef) and function.name == "__init__":
            scope = _function_scope(usage, function, {})
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.targets[0], ast.Attribute)
                    and isinstance(node.targets[0].value, ast.Name)
                    and node.targets[0].value.id == "self"
                    and isinstance(node.value, ast.Name)
                    and node.value.id in scope.types
                ):
                    found[node.targets[0].attr] = scope.types[node.value.id]
    return found


def _receiver_key(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        return f"self.{expr.attr}"
    return None


def _splat_keys(usage: Usage, node: ast.Call, splat: ast.expr) -> set[str] | None:
    """Keys of `**helper(...)` when helper is one of ours (imported or in this module) returning a dict literal."""
    helper = None
    if isinstance(splat, ast.Call) and isinstance(splat.func, ast.Name):
        if splat.func.id in usage.local_functions:
            helper = usage.local_functions[splat.func.id]
        elif splat.func.id in usage.imports:
            found = _resolve_import(usage, splat.func.id)
            helper = found.node if found is not None and isinstance(found.node, ast.FunctionDef) else None
        if helper is not None:
            returns = [n.value for n in ast.walk(helper) if isinstance(n, ast.Return)]
            if returns and all(
                isinstance(r, ast.Dict) and all(isinstance(k, ast.Constant) for k in r.keys) for r in returns
            ):
                return {k.value for r in returns for k in r.keys}
    usage.problem(node, f"cannot see the keys of **{ast.unparse(splat)}: spread a helper that returns a dict literal")
    return None


def _allowed_keywords(
    owner: src.Definition | None, function: ast.FunctionDef, *, bound: bool
) -> tuple[src.Parameters, set[str]]:
    params = src.parameters(function, bound=bound)
    allowed = params.names
    if params.varkw:
        allowed |= src.keys_read_from_kwargs(function)
        forward = KWARGS_FORWARDS.get((owner.module, owner.name, function.name)) if owner else None
        if forward and src.forwards_kwargs_to(function, forward[2]):
            receiver = src.resolve(forward[0], forward[1])
            found = src.member(receiver, forward[2]) if receiver else None
            if found and isinstance(found[1], ast.FunctionDef):
                allowed |= src.parameters(found[1], bound=True).names | src.keys_read_from_kwargs(found[1])
    return params, allowed


def _check_call(
    usage: Usage,
    node: ast.Call,
    label: str,
    owner: src.Definition | None,
    function: ast.FunctionDef | None,
    fields: set[str] | None,
    bound: bool,
) -> None:
    keywords = set()
    for keyword in node.keywords:
        if keyword.arg is None:
            keywords |= _splat_keys(usage, node, keyword.value) or set()
        else:
            keywords.add(keyword.arg)
    usage.checked_calls.append(f"{label}({', '.join(sorted(keywords))})")
    if fields is not None:  # a dataclass constructor
        params, allowed = src.Parameters((), (), False, None), fields
        if node.args:
            usage.problem(node, f"{label}: pass dataclass fields by keyword")
    else:
        params, allowed = _allowed_keywords(owner, function, bound=bound)
        if len(node.args) > len(params.positional) and not params.varargs:
            usage.problem(node, f"{label} takes {len(params.positional)} positional arguments, {len(node.args)} given")
    for name in sorted(keywords - allowed):
        usage.problem(node, f"{label} has no keyword argument {name!r}")


def _check_class_call(usage: Usage, node: ast.Call, cls: src.Definition, label: str) -> None:
    init = src.member(cls, "__init__")
    if src.is_dataclass(cls) and (init is None or not isinstance(init[1], ast.FunctionDef)):
        _check_call(usage, node, label, cls, None, src.dataclass_fields(cls), bound=True)
    elif init is not None and isinstance(init[1], ast.FunctionDef):
        _check_call(usage, node, label, init[0], init[1], None, bound=True)
    elif src.has_unreadable_base(cls):
        usage.checked_calls.append(f"{label}(...)  [__init__ inherited from a builtin, not checked]")
    else:
        usage.problem(node, f"{label}: no __init__ found in its source")


def _check_member_use(usage: Usage, node: ast.Attribute, cls: src.Definition, call: ast.Call | None) -> None:
    label = f"{cls.name}.{node.attr}"
    found = src.member(cls, node.attr)
    if found is None:
        usage.problem(node, f"{label} does not exist in {cls.module}")
    elif call is None:
        usage.checked_members.append(label)
    else:
        if isinstance(found[1], ast.FunctionDef):
            _check_call(usage, call, label, found[0], found[1], None, bound=True)
        else:
            usage.problem(call, f"{label} is not a method")


def check_module(module: str, source: str) -> Usage:
    """Problems in `source` (our module `module`) against the installed packages' sources."""
    tree = ast.parse(source)
    usage = Usage(module, _collect_imports(tree))
    usage.local_functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    for from_module, name in usage.imports.values():
        if src.resolve(from_module, name) is None and src.module_path(f"{from_module}.{name}") is None:
            usage.problem(tree, f"{from_module} has no {name}")
    self_types = {}
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            self_types.update(_self_types(usage, cls))
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:
        scope = _function_scope(usage, function, self_types)
        calls = {id(n.func): n for n in ast.walk(function) if isinstance(n, ast.Call)}
        for node in ast.walk(function):
            call = calls.get(id(node))
            if isinstance(node, ast.Name) and call is not None and node.id in usage.imports:
                found = _resolve_import(usage, node.id)
                if _is_class(found):
                    _check_class_call(usage, call, found, found.name)
                elif found is not None and isinstance(found.node, ast.FunctionDef):
                    _check_call(usage, call, found.name, None, found.node, None, bound=False)
            elif isinstance(node, ast.Attribute):
                key = _receiver_key(node.value)
                if isinstance(node.value, ast.Name) and node.value.id in usage.imports:
                    found = _resolve_import(usage, node.value.id)
                    if _is_class(found):
                        _check_member_use(usage, node, found, call)
                elif key in scope.types:
                    _check_member_use(usage, node, scope.types[key], call)
                elif key in scope.untyped:
                    usage.problem(node, f"{key} holds a library object of unknown type: annotate it with the class")
    return usage
