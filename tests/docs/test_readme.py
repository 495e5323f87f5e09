"""The README is followed literally: a quick start that fits on a screen, commands that exist and run
`--help`, timings the docs measured; the docs' configuration tables match the code."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpctl.cli import build_parser
from stacks.accelerators import INSTANCE_TYPES
from stacks.compute_groups import DEFAULT_COMPUTE_GROUPS, GROUP_KEYS, parse_compute_groups
from stacks.config import LIST_PARSERS, HyperPodConfig
from stacks.predeploy import parse_arguments

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
TESTING = (ROOT / "docs" / "testing.md").read_text()
QUICK_START_LINES = 60
REHEARSAL_TIMING_DOC = ROOT / "docs" / "pipeline.md"


def section(text: str, title_start: str) -> str:
    match = re.search(rf"^#+ {re.escape(title_start)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section starting with '{title_start}'"
    return match.group(1)


def fenced_commands(text: str) -> list[str]:
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "lifecycle" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def hpctl_verbs(command: str) -> list[str]:
    """`.venv/bin/hpctl job submit --config x` -> ["job", "submit"]: the words before the first option or value."""
    words = shlex.split(command)[1:]
    parser, verbs = build_parser(), []
    while words and not words[0].startswith("-"):
        choices = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if not choices or words[0] not in choices:
            break
        parser = choices[words[0]]
        verbs.append(words.pop(0))
    return verbs


def test_the_quick_start_fits_on_a_screen() -> None:
    quick_start = section(README, "Quick start")
    assert len(quick_start.strip().splitlines()) <= QUICK_START_LINES


def test_every_readme_command_exists() -> None:
    commands = fenced_commands(README)
    assert "make rehearse" in commands and "make test" in commands and "make deploy" in commands
    for command in commands:
        words = command.split()
        if words[0] == "make":
            assert words[1] in make_targets(), f"`{command}`: no such Makefile target"
        elif words[0].endswith("bin/hpctl"):
            assert hpctl_verbs(command), f"`{command}`: no such hpctl command"
        else:
            assert (ROOT / words[0]).exists(), f"`{command}`: {words[0]} does not exist in the repo"


def test_every_make_target_the_readme_names_is_in_make_help() -> None:
    named = set(re.findall(r"`make ([a-z0-9-]+)", README)) | {
        c.split()[1] for c in fenced_commands(README) if c.startswith("make ")
    }
    listed = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    described = set(re.findall(r"^  make (\S+)", listed.stdout, re.M))
    assert named and named <= described, f"not described by `make help`: {sorted(named - described)}"


def test_every_hpctl_verb_the_readme_names_runs_help(capsys) -> None:
    named = {tuple(hpctl_verbs(c)) for c in fenced_commands(README) if c.split()[0].endswith("bin/hpctl")}
    named |= {tuple(m.split()) for m in re.findall(r"`hpctl ([a-z]+(?: [a-z]+)?)", README)}
    assert named
    for verbs in sorted(named):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*verbs, "--help"])
        assert done.value.code == 0, verbs
        assert "usage: hpctl " + " ".join(verbs) in capsys.readouterr().out


def test_readme_timings_come_from_the_measurement_the_docs_cite() -> None:
    prose = re.sub(r"```text\n.*?```", "", README, flags=re.S)  # a sample of the output, not a claim
    timings = re.findall(r"\b(\d+(?:\.\d+)?) ?(s|min|minutes|seconds)\b", prose)
    assert timings, "the README states how long the rehearsal takes"
    rehearsal = section(REHEARSAL_TIMING_DOC.read_text(), "Local rehearsal")
    assert "docs/pipeline.md#local-rehearsal" in README
    for value, unit in timings:
        assert re.search(rf"\b{re.escape(value)} ?{unit}\b", rehearsal), f"README says {value} {unit}: not in the docs"


def test_no_doc_deploys_around_make_deploy() -> None:
    """`make deploy` runs the predeploy check first; a plain `cdk deploy` would skip it."""
    for path in markdown_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert "cdk deploy" not in line, f"{path.relative_to(ROOT)}:{number} deploys without make: {line.strip()}"
    recipes = [line for line in (ROOT / "Makefile").read_text().splitlines() if "$(CDK) deploy" in line]
    assert len(recipes) == 1 and "$(DEPLOY_ARGS)" in recipes[0]


def test_the_docs_override_example_reaches_predeploy_and_the_deploy() -> None:
    """The Spot example in docs/configuration.md, expanded by make, parsed as predeploy parses it."""
    command = next(c for c in fenced_commands(CONFIGURATION) if "compute_groups" in c)
    expanded = subprocess.run(
        ["bash", "-c", command.replace("make deploy", "make --no-print-directory -n -W .venv/.installed deploy", 1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert expanded.returncode == 0, expanded.stderr
    lines = expanded.stdout.splitlines()
    predeploy = next(line for line in lines if "-m stacks.predeploy" in line)
    deploy = next(line for line in lines if " deploy --require-approval" in line)
    words = shlex.split(predeploy.split("#", 1)[0])
    context, _, _ = parse_arguments(words[words.index("stacks.predeploy") + 1 :])
    groups = HyperPodConfig.from_context(context, environ={}).compute_groups
    assert [(g.instance_type, g.count, g.capacity) for g in groups] == [("ml.p5.48xlarge", 4, "spot")]
    assert shlex.split(deploy)[-2:] == words[-2:], "the deploy gets the same -c as predeploy"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in fenced_commands(section(README, "Quick start"))
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"], "CI runs the README's command only"


def test_the_testing_doc_names_real_targets() -> None:
    for target in re.findall(r"`make ([a-z0-9-]+)", TESTING):
        assert target in make_targets(), target


def test_every_cdk_context_key_is_documented_with_its_default() -> None:
    for field in dataclasses.fields(HyperPodConfig):
        if field.name == "compute_groups":  # a list: its own section shows the default as cdk.json has it
            assert re.search(r"^\| `compute_groups` \| one trn1 group \|", CONFIGURATION, re.M)
            continue
        if field.name in LIST_PARSERS:  # lists (teams, users, alert_emails), empty by default, as cdk.json writes them
            assert re.search(rf"^\| `{field.name}` \| `\[\]` \|", CONFIGURATION, re.M), field.name
            continue
        default = str(field.default).lower() if isinstance(field.default, bool) else str(field.default)
        row = re.search(rf"^\| `{field.name}` \| `([^`]*)` \|", CONFIGURATION, re.M)
        assert row, f"cdk.json key {field.name} is missing from docs/configuration.md's table"
        assert row.group(1) == default, f"{field.name}: docs say {row.group(1)}, code says {default}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(path: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if not target.startswith("http"):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"


def test_compute_groups_section_shows_the_default_and_every_group_key() -> None:
    section = CONFIGURATION.split("## Compute groups", 1)[1].split("\n## ", 1)[0]
    default_json = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    listed = json.loads("{" + default_json + "}")["compute_groups"]
    assert parse_compute_groups(listed) == DEFAULT_COMPUTE_GROUPS
    for key in GROUP_KEYS:
        assert re.search(rf"^\| `{key}` \|", section, re.M), f"group key {key} is not documented"
    for instance_type, facts in INSTANCE_TYPES.items():
        if facts.accelerated:
            size = instance_type.rsplit(".", 1)[1]
            assert f"`{instance_type}`" in section or f"`.{size}`" in section, instance_type


def doc_accelerator_rows() -> dict[str, tuple[str, str, str]]:
    """Each accelerated type of the accelerator table: (devices, EFA interfaces, capability)."""
    rows = {}
    for line in re.findall(r"^\| `ml\.(?:trn|p|g).*$", CONFIGURATION, re.M):
        names, _, devices, efa, capability = (cell.strip() for cell in line.strip("|").split("|"))
        types = re.findall(r"`([^`]+)`", names)
        family = types[0].rsplit(".", 1)[0]
        efa_values = [value.strip() for value in efa.split(",")]
        for index, name in enumerate(types):
            full = family + name if name.startswith(".") else name
            rows[full] = (devices.split()[0], efa_values[min(index, len(efa_values) - 1)], capability.split()[0])
    return rows


def test_accelerator_table_matches_the_code() -> None:
    rows = doc_accelerator_rows()
    accelerated = {name: facts for name, facts in INSTANCE_TYPES.items() if facts.accelerated}
    assert sorted(rows) == sorted(accelerated)
    for name, facts in accelerated.items():
        capability = ".".join(map(str, facts.cuda_capability)) if facts.cuda_capability else "-"
        assert rows[name] == (str(facts.devices), str(facts.efa_interfaces), capability), name


def test_the_smoke_table_lists_every_smoke_job_the_chain_stages() -> None:
    from llm_pipeline.jobs import smoke
    from llm_pipeline.submit import SHARED_STEPS, STEPS

    table = section((ROOT / "docs" / "pipeline.md").read_text(), "Smoke stage and estimate")
    assert f"{smoke.SMOKE_EVAL_ROWS} held-out rows" in table
    for step in STEPS:
        if step not in SHARED_STEPS:
            assert f"`smoke-{step}`" in table, f"docs/pipeline.md's smoke table omits smoke-{step}"
