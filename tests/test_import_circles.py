"""No import circle between the project's own modules: the graph of every import in hpctl, stacks, lifecycle,
tools, bench, payloads/llm_pipeline, cluster_contract and app, read from the syntax trees. Imports inside
functions count too: a lazy import that breaks a circle at run time still ties the two modules in a loop."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
# (folder the import names start from, the files or folders of the project's modules there)
SOURCES = ((ROOT, ("hpctl", "stacks", "lifecycle", "tools", "bench", "cluster_contract.py", "app.py")),)
SOURCES += ((ROOT / "payloads", ("llm_pipeline",)),)


def module_files() -> dict[str, Path]:
    """{dotted module name: its file}."""
    modules = {}
    for base, entries in SOURCES:
        for entry in entries:
            path = base / entry
            for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
                parts = list(file.relative_to(base).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                modules[".".join(parts)] = file
    return modules


def imports_of(name: str, file: Path, known: set[str]) -> set[str]:
    """The project's modules that ``file`` (module ``name``) imports, anywhere in it."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, source] if source else base)
            # `from a import b` imports module a.b when there is one, else a name of a
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            owner = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known), None)
            if owner and owner != name:
                found.add(owner)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, file, set(modules)) for name, file in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[tuple[list[str], set[str]]]:
    """Each strongly connected group of two or more modules (Tarjan): its shortest loop from its first module back
    to it, and the whole group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(_loop(graph, group), group) for group in groups]


def _loop(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, within the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(group)} is no loop")


def test_no_import_circle_between_the_projects_modules():
    graph = import_graph()
    assert {"hpctl.cli", "stacks.stack", "llm_pipeline.config", "cluster_contract", "app"} <= set(graph)
    found = [f"{' -> '.join(loop)} (the circle holds {', '.join(sorted(group))})" for loop, group in circles(graph)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_the_reader_sees_a_circle_through_a_lazy_relative_import(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (package / "c.py").write_text("import pkg.a\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", ((tmp_path, ("pkg",)),))
    graph = import_graph()
    assert graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert circles(graph) == [(["pkg.a", "pkg.sub.b", "pkg.a"], {"pkg.a", "pkg.sub.b"})]
