"""The one command registry: each room of hpctl registers its commands under the room's name, and the top-level
help lists them grouped by room (argparse alone prints one flat list)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

# Lays out the grouped list as argparse lays out a command's options.
NAME_WIDTH, INDENT = 18, "  "


@dataclass(frozen=True)
class Room:
    name: str  # the subpackage, hpctl/<name>/
    summary: str  # what an operator does there
    register: Callable[[RoomCommands, argparse.ArgumentParser], None]  # adds the room's commands


class RoomCommands:
    """The top-level subparsers as one room sees them: add_parser records each command under the room."""

    def __init__(self, sub: argparse._SubParsersAction) -> None:
        self._sub = sub
        self.listed: list[tuple[str, str]] = []  # (command, its help), in the order the room adds them

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        self.listed.append((name, kwargs.get("help", "")))
        return self._sub.add_parser(name, **kwargs)


def register_rooms(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, rooms: tuple[Room, ...]) -> str:
    """Registers every room's commands; returns the grouped command list for the top-level help."""
    lines = ["commands, by what an operator does (`hpctl COMMAND --help` describes one):"]
    for room in rooms:
        commands = RoomCommands(sub)
        room.register(commands, common)
        lines += ["", f"{room.name}: {room.summary}"]
        for name, text in commands.listed:
            lines.append(f"{INDENT}{name:<{NAME_WIDTH - 2}}  {text}")
    return "\n".join(lines)
