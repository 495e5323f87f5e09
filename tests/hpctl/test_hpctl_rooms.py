"""hpctl's rooms: every module sits in the subpackage of what an operator does there (cluster, runs, observe, nodes,
jobs, teams) or in hpctl/common, which every room may import and which imports no room; a room imports no other
room; no import circle inside hpctl, function-level imports counted. cli.py assembles the rooms' commands."""

from __future__ import annotations

import argparse
import ast
import re
import shutil
from pathlib import Path

from hpctl import cli

ROOT = Path(__file__).resolve().parents[2]
SHARED = "common"
TOP_LEVEL = {"__init__.py", "__main__.py", "cli.py"}  # the package, `python -m hpctl` and the assembler


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def hpctl_imports(path: Path, package: Path, modules: set[str]) -> set[str]:
    """The hpctl modules ``path`` imports anywhere in it (a function's imports too): `from a import b` is a.b when
    that is a module, else a."""
    here = module_name(path, package)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                package_parts = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
                anchor = package_parts[: len(package_parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {name for name in names if name == package.name or name.startswith(f"{package.name}.")}
    return found - {here}


def import_graph(package: Path) -> dict[str, set[str]]:
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    return {name: hpctl_imports(path, package, set(paths)) for name, path in paths.items()}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] not in {"cli", "__main__"}) else None


def stray_modules(package: Path) -> list[str]:
    """Modules outside every subpackage, but for the package's own three."""
    return sorted(
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path.parent == package and path.name not in TOP_LEVEL
    )


def room_breaches(graph: dict[str, set[str]], package: str) -> list[str]:
    """A room's import of another room, or the shared subpackage's import of any room."""
    breaches = []
    for module, imported in sorted(graph.items()):
        room = room_of(module)
        if room is None:
            continue  # hpctl, hpctl.cli, hpctl.__main__: cli assembles the rooms
        allowed = {room, SHARED}
        for target in sorted(imported):
            if target != package and room_of(target) not in (allowed if room != SHARED else {SHARED}):
                breaches.append(f"{module} imports {target}")
    return breaches


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the modules along it (depth-first search for back edges)."""
    found, state, trail = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        trail.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target)
        trail.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_every_hpctl_module_sits_in_a_room_or_the_shared_subpackage():
    package = ROOT / "hpctl"
    assert stray_modules(package) == []
    rooms = {path.parent.name for path in package.glob("*/*.py")}
    assert rooms == {SHARED} | {room.name for room in cli.ROOMS}, "a subpackage without its room in cli.ROOMS"


def test_a_room_imports_only_itself_and_the_shared_subpackage_and_hpctl_has_no_circle():
    graph = import_graph(ROOT / "hpctl")
    assert len(graph) > 40
    assert room_breaches(graph, "hpctl") == []
    assert circles(graph) == []


def test_the_rules_catch_a_stray_module_a_cross_room_import_and_a_circle(tmp_path):
    package = tmp_path / "hpctl"
    shutil.copytree(ROOT / "hpctl", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "loose.py").write_text('"""a module outside every room"""\n')
    assert stray_modules(package) == ["hpctl/loose.py"]

    runs = package / "runs" / "commands.py"
    runs.write_text(runs.read_text() + "\n\ndef later():\n    from hpctl.nodes.commands import show_nodes\n")
    shared = package / "common" / "table.py"
    shared.write_text(shared.read_text() + "\nfrom ..teams import usage\n")  # relative, to a room
    breaches = room_breaches(import_graph(package), "hpctl")
    assert breaches == [
        "hpctl.common.table imports hpctl.teams.usage",
        "hpctl.runs.commands imports hpctl.nodes.commands",
    ]

    usage = package / "teams" / "usage.py"  # commands -> usage -> commands, the way back inside a function
    usage.write_text(usage.read_text() + "\n\ndef back():\n    from hpctl.teams import commands\n")
    assert circles(import_graph(package)) == [["hpctl.teams.usage", "hpctl.teams.commands", "hpctl.teams.usage"]]


def top_level_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = cli.build_parser()
    (sub,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return parser, sub.choices


def handler_modules(command: argparse.ArgumentParser) -> set[str]:
    """The modules of the handlers a command runs (each action's, for a command with actions)."""
    nested = [action for action in command._actions if isinstance(action, argparse._SubParsersAction)]
    if not nested:
        return {command.get_default("handler").__module__}
    return {module for action in nested for child in action.choices.values() for module in handler_modules(child)}


def rooms_commands() -> dict[str, set[str]]:
    """Each room's top-level commands as the grouped help lists them."""
    help_text = cli.build_parser().format_help()
    listed = {}
    for room in cli.ROOMS:
        block = help_text.split(f"\n{room.name}: {room.summary}\n", 1)[1].split("\n\n", 1)[0]
        listed[room.name] = [line.split()[0] for line in block.splitlines()]
    return listed


def test_the_help_lists_every_command_once_under_the_room_whose_modules_handle_it():
    _, commands = top_level_commands()
    listed = rooms_commands()
    for room, names in listed.items():
        assert names, room
        for name in names:
            assert {room_of(module) for module in handler_modules(commands[name])} == {room}, name
    assert sorted(name for names in listed.values() for name in names) == sorted(commands)


def test_docs_hpctl_md_names_each_group_s_commands_and_folder_as_the_help_does():
    text = (ROOT / "docs" / "hpctl.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (.+?) \| `hpctl/(\w+)/` \|$", text, re.M)
    documented = {
        group: (folder, {span.split()[0] for span in re.findall(r"`([^`]+)`", cell) if not span.startswith("-")})
        for group, cell, folder in rows
    }
    assert documented == {room: (room, set(names)) for room, names in rooms_commands().items()}
