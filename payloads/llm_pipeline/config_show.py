"""`python -m llm_pipeline.config_show RUN.toml`: the run config as every step sees it.

Prints every key as TOML, resolved (paths and `${VAR}` expanded, derived defaults such as gradient
checkpointing for full fine-tuning applied), and marks each key the file leaves at its default, so a
run config can be read without knowing the defaults. Validation errors stop it like any step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from llm_pipeline.cli import BAD_INPUT, add_version
from llm_pipeline.config import ConfigError, RunConfig, load, read_toml


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def render(cfg: RunConfig, explicit: dict[str, dict[str, object]], source: str) -> str:
    """Every key of ``cfg`` as TOML; keys not in ``explicit`` (the file's tables) marked as defaults."""
    lines = [f"# {source}, resolved; '# default' marks the keys the file does not set"]
    for section in dataclasses.fields(cfg):
        lines.append(f"\n[{section.name}]")
        for item in dataclasses.fields(getattr(cfg, section.name)):
            value = toml_value(getattr(getattr(cfg, section.name), item.name))
            given = item.name in explicit.get(section.name, {})
            lines.append(f"{item.name} = {value}" + ("" if given else "  # default"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_pipeline.config_show", description=__doc__.splitlines()[0])
    parser.add_argument("show", metavar="RUN.toml", help="print this run config, resolved")
    add_version(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load(args.show)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT
    explicit = read_toml(Path(args.show))  # load() read it already: the keys the file sets
    print(render(cfg, explicit, args.show))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
