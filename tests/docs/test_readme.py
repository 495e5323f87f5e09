"""The README is followed literally: its offline commands, keys and links must match the code."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from stacks.accelerators import INSTANCE_TYPES
from stacks.compute_groups import DEFAULT_COMPUTE_GROUPS, GROUP_KEYS, parse_compute_groups
from stacks.config import HyperPodConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OFFLINE_SECTIONS = ("Quick start (offline", "How it is tested without AWS")


def section(title_start: str) -> str:
    match = re.search(rf"^## {re.escape(title_start)}.*?$(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no section starting with '## {title_start}'"
    return match.group(1)


def fenced_commands(text: str) -> list[str]:
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("title", OFFLINE_SECTIONS)
def test_offline_commands_name_real_targets_or_scripts(title: str) -> None:
    commands = fenced_commands(section(title))
    if title.startswith("Quick start"):
        assert commands, "the quick start must show its commands"
    for command in commands:
        words = command.split()
        if words[0] == "make":
            assert words[1] in make_targets(), f"`{command}`: no such Makefile target"
        else:
            assert (ROOT / words[0]).exists(), f"`{command}`: {words[0]} does not exist in the repo"


def test_every_make_target_the_readme_mentions_exists() -> None:
    mentioned = set(re.findall(r"`make ([a-z-]+)", README))
    assert mentioned, "the README names no make target"
    assert mentioned <= make_targets(), f"unknown targets: {sorted(mentioned - make_targets())}"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in fenced_commands(section("Quick start (offline"))
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"], "CI runs the README's command only"


def test_every_cdk_context_key_is_documented_with_its_default() -> None:
    for field in dataclasses.fields(HyperPodConfig):
        if field.name == "compute_groups":  # a list: its own section shows the default as cdk.json has it
            assert re.search(r"^\| `compute_groups` \| one trn1 group \|", README, re.M)
            continue
        default = str(field.default).lower() if isinstance(field.default, bool) else str(field.default)
        row = re.search(rf"^\| `{field.name}` \| `([^`]*)` \|", README, re.M)
        assert row, f"cdk.json key {field.name} is missing from the README's configuration table"
        assert row.group(1) == default, f"{field.name}: README says {row.group(1)}, code says {default}"


def test_local_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to missing {target}"


def test_compute_groups_section_shows_the_default_and_every_group_key() -> None:
    section = README.split("### Compute groups", 1)[1].split("\n## ", 1)[0]
    default_json = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    listed = json.loads("{" + default_json + "}")["compute_groups"]
    assert parse_compute_groups(listed) == DEFAULT_COMPUTE_GROUPS
    for key in GROUP_KEYS:
        assert re.search(rf"^\| `{key}` \|", section, re.M), f"group key {key} is not documented"
    for instance_type, facts in INSTANCE_TYPES.items():
        if facts.accelerated:
            size = instance_type.rsplit(".", 1)[1]
            assert f"`{instance_type}`" in section or f"`.{size}`" in section, instance_type


def readme_accelerator_rows() -> dict[str, tuple[str, str, str]]:
    """Each accelerated type of the README's accelerator table: (devices, EFA interfaces, capability)."""
    rows = {}
    for line in re.findall(r"^\| `ml\.(?:trn|p|g).*$", README, re.M):
        names, _, devices, efa, capability = (cell.strip() for cell in line.strip("|").split("|"))
        types = re.findall(r"`([^`]+)`", names)
        family = types[0].rsplit(".", 1)[0]
        efa_values = [value.strip() for value in efa.split(",")]
        for index, name in enumerate(types):
            full = family + name if name.startswith(".") else name
            rows[full] = (devices.split()[0], efa_values[min(index, len(efa_values) - 1)], capability.split()[0])
    return rows


def test_readme_accelerator_table_matches_the_code() -> None:
    rows = readme_accelerator_rows()
    accelerated = {name: facts for name, facts in INSTANCE_TYPES.items() if facts.accelerated}
    assert sorted(rows) == sorted(accelerated)
    for name, facts in accelerated.items():
        capability = ".".join(map(str, facts.cuda_capability)) if facts.cuda_capability else "-"
        assert rows[name] == (str(facts.devices), str(facts.efa_interfaces), capability), name
