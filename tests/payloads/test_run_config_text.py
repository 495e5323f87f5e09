"""One module sets and derives a run config as text (jobs/run_config_text.py): the smoke stage, the sweep, the
rehearsal and the tests use it, and what it writes is a run config config.py loads (config.parse_toml reads it)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from llm_pipeline import config
from llm_pipeline.config import ConfigError
from llm_pipeline.jobs.run_config_text import derived_config, set_key, write_derived

ROOT = Path(__file__).parents[2]
TINY = ROOT / "payloads" / "configs" / "tiny-cpu.toml"
ENV = {"HPL_MODELS_DIR": "/m", "HPL_DATASETS_DIR": "/d", "HPL_OUTPUTS_DIR": "/o"}


def read_key(text: str, table: str, key: str) -> object:
    return config.parse_toml(text, "t")[table][key]


@pytest.mark.parametrize("value", [12, 0.25, True, False, "full", 'with "quotes"', ["a", 'b = "c"']])
def test_a_key_set_reads_back(value):
    text = set_key(TINY.read_text(), "train", "method", value)
    assert read_key(text, "train", "method") == value


def test_a_key_is_replaced_added_to_its_table_or_to_a_new_table():
    text = "[train]\nmax_steps = 3  # short\n\n[data]\npacking = true\n"
    assert set_key(text, "train", "max_steps", 9) == "[train]\nmax_steps = 9\n\n[data]\npacking = true\n"
    assert set_key(text, "train", "method", "full") == (
        '[train]\nmax_steps = 3  # short\nmethod = "full"\n\n[data]\npacking = true\n'
    )
    assert set_key(text, "eval", "answers", 1).endswith("\n[eval]\nanswers = 1\n")
    assert set_key(text, "train", "max_steps", None) == "[train]\n\n[data]\npacking = true\n"  # None: removed
    assert set_key(text, "data", "max_steps", None) == text  # another table's key stays


def test_a_derived_run_has_its_own_folder_absolute_paths_and_loads(tmp_path):
    source = tmp_path / "configs" / "run.toml"
    source.parent.mkdir()
    source.write_text(set_key(TINY.read_text(), "paths", "model_dir", "models/tiny"))
    target = write_derived(source, tmp_path / "other" / "run.toml", {("train", "max_steps"): 4}, run_dir="/o/other")
    loaded = config.load(target, env=ENV)
    assert (loaded.train.max_steps, loaded.paths.output_dir) == (4, "/o/other")
    assert loaded.paths.model_dir == str(source.parent / "models" / "tiny")
    assert derived_config(source, "/o/other", {("train", "max_steps"): 4}) == target.read_text()


@pytest.mark.parametrize("run_dir", ["/o/other", None], ids=["another-run", "same-run"])
def test_a_copy_elsewhere_reads_the_users_own_dataset_beside_the_original(tmp_path, run_dir):
    """The rehearsal's and the smoke stage's copies live in other folders: a relative data.dataset in them names
    the file beside the original config (absolute), and a Hub id stays one."""
    source = tmp_path / "mydata" / "run.toml"
    source.parent.mkdir()
    source.write_text(set_key(TINY.read_text(), "data", "dataset", "records/mine.jsonl"))
    copy = write_derived(source, tmp_path / "elsewhere" / "run.toml", {("train", "max_steps"): 4}, run_dir=run_dir)
    assert read_key(copy.read_text(), "data", "dataset") == str(source.parent / "records" / "mine.jsonl")
    assert config.load(copy, env=ENV).data.dataset == config.load(source, env=ENV).data.dataset
    source.write_text(set_key(TINY.read_text(), "data", "dataset", "databricks/databricks-dolly-15k"))
    copy = write_derived(source, tmp_path / "elsewhere" / "run.toml", {}, run_dir=run_dir)
    assert config.load(copy, env=ENV).data.dataset == "databricks/databricks-dolly-15k"


def test_a_copy_of_a_config_that_is_not_toml_is_refused_naming_it(tmp_path):
    source = tmp_path / "run.toml"
    source.write_text("[train]\nmethod = 'x\n")
    with pytest.raises(ConfigError, match=rf"^run config {source} is not valid TOML: "):
        write_derived(source, tmp_path / "copy.toml", {}, run_dir="/o/other")
    assert not (tmp_path / "copy.toml").exists()


def _text_surgery(path: Path) -> list[str]:
    """re.sub/re.subn on `key = ...` lines, and str.replace of a `key = ` line or a `[table]` header."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        first = node.args[0]
        text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        if isinstance(first, ast.JoinedStr):
            text = "".join(p.value for p in first.values if isinstance(p, ast.Constant))
        if text is None:
            continue
        regex = node.func.attr in ("sub", "subn") and getattr(node.func.value, "id", "") == "re"
        if (regex and " = " in text) or (
            node.func.attr == "replace" and (" = " in text or (text.startswith("[") and text.endswith("]\n")))
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def _toml_lines_written(path: Path) -> list[str]:
    """f-strings that write a ``key = <json.dumps(value)>`` line: a run config written outside the editor."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, value in itertools.pairwise(parts):
                dumps = isinstance(value, ast.FormattedValue) and ast.unparse(value.value).startswith("json.dumps(")
                if dumps and isinstance(before, ast.Constant) and before.value == " = ":
                    found.append(f"{path}:{node.lineno}")
    return found


def test_no_run_config_text_surgery_in_tools_tests_or_payloads():
    editor = ROOT / "payloads" / "llm_pipeline" / "jobs" / "run_config_text.py"
    folders = ("tools", "tests", "payloads")
    paths = [
        p for folder in folders for p in sorted((ROOT / folder).rglob("*.py")) if p not in (Path(__file__), editor)
    ]
    assert [place for path in paths for place in _text_surgery(path)] == []
    programs = [p for p in sorted((ROOT / "payloads").rglob("*.py")) if p != editor]
    assert [place for path in programs for place in _toml_lines_written(path)] == []


def test_the_surgery_finder_sees_it(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import re\nt = re.subn(r"(?m)^max_steps = .*$", "", "")\nu = "".replace("[train]\\n", "")\n')
    assert len(_text_surgery(module)) == 2
    module.write_text('import json\nlines = [f"{key} = {json.dumps(value)}" for key, value in {}.items()]\n')
    assert len(_toml_lines_written(module)) == 1  # trn2_acceptance.write_toml's way, before the editor


def test_no_program_reads_a_run_config_key_by_hand():
    """Every program loads the whole RunConfig (config.load); only the editor reads a config's tables itself."""
    reader, editor = (
        ROOT / "payloads" / "llm_pipeline" / "config.py",
        ROOT / "payloads" / "llm_pipeline" / "jobs" / "run_config_text.py",
    )
    sources = [p for folder in ("payloads", "hpctl", "tools", "bench") for p in (ROOT / folder).rglob("*.py")]
    readers = [
        str(p.relative_to(ROOT)) for p in sources if p not in (reader, editor) and "parse_toml(" in p.read_text()
    ]
    assert sources and readers == []
