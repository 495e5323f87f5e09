"""The run-config key table in docs/training.md, generated from llm_pipeline/config.py.

Each key is described once, next to its field (``described(default, "...", *rules)`` or
``ranged(default, rule, "...")`` in config.py: a range's words open the key's line). This
tool writes the tables between the markers below; ``--check`` only reports drift (the docs test
runs the same comparison).

    python -m tools.doc_tables          # rewrite the tables (make doc-tables)
    python -m tools.doc_tables --check  # exit 1 when a table differs from config.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from llm_pipeline.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/training.md",)
CONFIG_FILE = "payloads/llm_pipeline/config.py"
BEGIN = f"<!-- run-config keys: generated from {CONFIG_FILE} by `make doc-tables`; edit the descriptions there -->"
END = "<!-- end of run-config keys -->"


def run_config_keys() -> list[tuple[str, dataclasses.Field]]:
    """Every run-config key as (``section.name``, its dataclass field), in declaration order."""
    return [
        (f"{section.name}.{item.name}", item)
        for section in dataclasses.fields(RunConfig)
        for item in dataclasses.fields(section.default_factory())
    ]


def shown_default(value: object) -> str:
    """A default as it is written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if value == "":
        return '""'
    return str(value)


def table() -> str:
    lines = ["| key | default | description |", "|---|---|---|"]
    for key, item in run_config_keys():
        description = item.metadata.get("description", "")
        if "range" in item.metadata:  # a numeric key's range opens its line (config.ranged)
            description = f"{item.metadata['range']}: {description}"
        lines.append(f"| `{key}` | `{shown_default(item.default)}` | {description} |")
    return "\n".join(lines)


def generated_block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def current_block(text: str, doc: str) -> str:
    """The generated block of one document, markers included."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no run-config table markers; put these lines where the table goes:\n{BEGIN}\n{END}")
    return text[start : end + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        block = current_block(text, doc)
        if block == generated_block():
            continue
        stale.append(doc)
        if not args.check:
            path.write_text(text.replace(block, generated_block()))
            print(f"{doc}: run-config table rewritten from {CONFIG_FILE}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run `make doc-tables`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
