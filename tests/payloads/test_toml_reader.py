"""One TOML reader of run configs on both sides (config.parse_toml): tomllib on the nodes' Python 3.11+, tomli from
the shipped wheel (config.TOMLI_WHEEL) on the controller's 3.10, which has no tomllib. Hand-made edge cases give
equal values or equal refusals on both, and a number read from a run config is finite."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from llm_pipeline import config
from llm_pipeline.config import ConfigError

ROOT = Path(__file__).parents[2]
PAYLOADS = ROOT / "payloads"
PACKAGE = PAYLOADS / "llm_pipeline"

# (name, TOML text, whether TOML 1.0 reads it): the one-line-values form the project writes, every other form a
# user may write, and what the project's former hand-written reader got wrong (TAB, \U, \/, DEL, 030 ...).
CASES = [
    ("table and key", "[t]\na = 1\n", True),
    ("TAB inside a string", '[t]\na = "x\ty"\n', True),
    ("\\U escape", '[t]\na = "\\U0001F600"\n', True),
    ("\\u escape", '[t]\na = "caf\\u00e9"\n', True),
    ("literal string with a backslash", "[t]\na = 'C:\\dir'\n", True),
    ("multi-line basic string", '[t]\na = """\nline 1\nline 2"""\n', True),
    ("line-ending backslash", '[t]\na = """one \\\n    two"""\n', True),
    ("multi-line literal string", "[t]\na = '''\nraw \\n'''\n", True),
    ("dotted keys", "a.b.c = 1\n", True),
    ("dotted table header", "[x.y]\nz = 1\n", True),
    ("inline table", '[t]\na = {b = 1, c = "d"}\n', True),
    ("array of inline tables", "[t]\na = [{b = 1}, {b = 2}]\n", True),
    ("multi-line array, comments, trailing comma", '[t]\na = [\n  "x",  # one\n  "y",\n]\n', True),
    ("array of tables", "[[runs]]\nn = 1\n[[runs]]\nn = 2\n", True),
    ("underscores between digits", "[t]\na = 1_000\nb = 3.141_5\n", True),
    ("hex, octal, binary", "[t]\na = 0xff\nb = 0o17\nc = 0b101\n", True),
    ("exponents and signed zero", "[t]\na = 6.02e+23\nb = -0.0\nc = 1E-5\n", True),
    ("inf", "[t]\na = inf\nb = -inf\nc = +inf\n", True),
    ("nan", "[t]\na = nan\nb = -nan\n", True),
    ("dates and times", "[t]\na = 1979-05-27T07:32:00Z\nb = 1979-05-27\nc = 07:32:00.5\n", True),
    ("quoted keys", "[t]\n\"a b\" = 1\n'c.d' = 2\n", True),
    ("bare key with a dash", "[t]\na-b = 1\n", True),
    ("non-ASCII text", '[t]\na = "é ✓"\n', True),
    ("empty strings and arrays", "[t]\na = \"\"\nb = []\nc = ''\n", True),
    ("booleans and comments", "# head\n[t] # table\na = true # on\nb = false\n", True),
    ("\\/ escape", '[t]\na = "\\/"\n', False),
    ("DEL inside a string", '[t]\na = "x\x7fy"\n', False),
    ("NUL inside a string", '[t]\na = "x\x00y"\n', False),
    ("leading zero", "[t]\na = 030\n", False),
    ("leading underscore", "[t]\na = _30\n", False),
    ("trailing underscore", "[t]\na = 30_\n", False),
    ("double underscore", "[t]\na = 3__0\n", False),
    ("underscore before the point", "[t]\na = 0_.005\n", False),
    ("bare point", "[t]\na = .5\nb = 1.\n", False),
    ("NaN spelled otherwise", "[t]\na = NaN\n", False),
    ("key set twice", "[t]\na = 1\na = 2\n", False),
    ("table twice", "[t]\n[t]\n", False),
    ("dotted key then a value", "a.b = 1\na = 2\n", False),
    ("inline table extended", "a = {b = 1}\na.c = 2\n", False),
    ("inline table over lines (TOML 1.1)", "[t]\na = {\n  b = 1\n}\n", False),
    ("trailing comma in an inline table (TOML 1.1)", "[t]\na = {b = 1,}\n", False),
    ("\\e and \\x escapes (TOML 1.1)", '[t]\na = "\\e"\nb = "\\x41"\n', False),
    ("time without seconds (TOML 1.1)", "[t]\na = 07:32\n", False),
    ("unterminated string", '[t]\na = "x\n', False),
    ("key without a value", "[t]\na =\n", False),
]

# Run config files whose numbers are not finite: refused naming the key, on both sides.
NON_FINITE = {
    "[train]\nlearning_rate = inf\n": "train.learning_rate: expected a finite number, got inf",
    "[train]\nepochs = nan\n": "train.epochs: expected a finite number, got nan",
    "[lora]\ndropout = -inf\n": "lora.dropout: expected a finite number, got -inf",
}


def outcome(text: str) -> list[str]:
    """What the one reader makes of ``text``: its value's repr, or the refusal."""
    try:
        return ["read", repr(config.parse_toml(text, "t"))]
    except ConfigError as error:
        return ["refused", str(error)]


def load_outcome(text: str) -> str:
    try:
        config.from_dict(config.parse_toml(text, "t"), env={})
    except ConfigError as error:
        return str(error)
    return "loaded"


# The controller's side: stdlib only (-S: no site-packages), tomllib unimportable as on Python 3.10, the payloads
# folder on the path as submit has it; the same two functions, and which module read.
CONTROLLER = f"""
import json, sys
sys.modules["tomllib"] = None
sys.path.insert(0, {str(PAYLOADS)!r})
from llm_pipeline import config
from llm_pipeline.config import ConfigError
{inspect.getsource(outcome)}
{inspect.getsource(load_outcome)}
cases = json.load(sys.stdin)
reader = config.toml_reader()
print(json.dumps({{
    "reader": [reader.__name__, reader.__file__],
    "parse": [outcome(text) for text in cases["parse"]],
    "load": [load_outcome(text) for text in cases["load"]],
}}))
"""


def _controller_side(python: str) -> dict:
    cases = {"parse": [text for _, text, _ in CASES], "load": list(NON_FINITE)}
    out = subprocess.run(
        [python, "-S", "-c", CONTROLLER], input=json.dumps(cases), capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def controller() -> dict:
    """This Python with tomllib taken away (fast, and what every case below compares with)."""
    return _controller_side(sys.executable)


def python_3_10() -> str:
    """The controller's Python, 3.10: $PYTHON310, python3.10 on PATH, or pyenv's 3.10 (as tools/check_python312.sh
    finds its 3.12); the test fails naming how to get one (no skip)."""
    pyenv = shutil.which("pyenv")
    prefix = subprocess.run([pyenv, "prefix", "3.10"], capture_output=True, text=True).stdout.strip() if pyenv else ""
    candidates = [
        os.environ.get("PYTHON310", ""),
        shutil.which("python3.10") or "",
        prefix and f"{prefix}/bin/python3.10",
    ]
    for candidate in filter(None, candidates):
        version = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if version.returncode == 0 and version.stdout.strip() == b"(3, 10)":
            return candidate
    raise AssertionError("no Python 3.10 (the controller's): install it (pyenv install 3.10) or set PYTHON310")


def test_python_3_10_reads_and_refuses_every_case_as_3_11_does(controller):
    """The controller's real interpreter: every edge case and every non-finite number, equal to the nodes'."""
    real = _controller_side(python_3_10())
    assert real["reader"][0] == "tomli" and Path(real["reader"][1]).is_relative_to(PACKAGE / config.TOMLI_WHEEL)
    assert real["parse"] == [outcome(text) for _, text, _ in CASES]
    assert real["load"] == list(NON_FINITE.values()) == controller["load"]


def test_the_controller_reads_with_tomli_from_the_shipped_wheel(controller):
    name, file = controller["reader"]
    assert name == "tomli"
    assert Path(file).is_relative_to(PACKAGE / config.TOMLI_WHEEL)
    assert config.toml_reader() is tomllib  # here, as on the nodes


def test_the_shipped_wheel_is_the_pinned_one_and_packaged():
    assert [path.name for path in PACKAGE.glob("tomli-*.whl")] == [config.TOMLI_WHEEL]
    digest = hashlib.sha256((PACKAGE / config.TOMLI_WHEEL).read_bytes()).hexdigest()
    assert digest == config.TOMLI_WHEEL_SHA256, f"{config.TOMLI_WHEEL} is not the pinned file"
    # `pip install .` carries it too (hpctl on a Python 3.10 laptop loads run configs)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(PACKAGE.glob(pattern) for pattern in package_data["llm_pipeline"])


def test_the_shipped_wheel_is_python_3_10_code():
    """What the controller's 3.10 imports from the zip: 3.10 grammar, and a release that says it runs there."""
    with zipfile.ZipFile(PACKAGE / config.TOMLI_WHEEL) as wheel:
        sources = [name for name in wheel.namelist() if name.endswith(".py")]
        assert "tomli/__init__.py" in sources
        for name in sources:
            ast.parse(wheel.read(name), name, feature_version=(3, 10))
        metadata = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
        assert "Requires-Python: >=3.8" in wheel.read(metadata).decode()


@pytest.mark.parametrize(
    ("index", "valid"), [(i, valid) for i, (_, _, valid) in enumerate(CASES)], ids=[c[0] for c in CASES]
)
def test_both_sides_read_or_refuse_alike(controller, index, valid):
    here = outcome(CASES[index][1])
    assert controller["parse"][index] == here
    assert here[0] == ("read" if valid else "refused")
    if not valid:
        assert here[1].startswith("t is not valid TOML: ") and "\n" not in here[1]


def test_there_are_forty_cases_half_of_them_refused():
    assert len(CASES) >= 40
    assert 15 <= sum(not valid for _, _, valid in CASES) <= len(CASES) - 15


def test_a_number_that_is_not_finite_is_refused_naming_its_key_on_both_sides(controller):
    assert [load_outcome(text) for text in NON_FINITE] == list(NON_FINITE.values())
    assert controller["load"] == list(NON_FINITE.values())
    assert load_outcome("[train]\nlearning_rate = 1e-4\n") == "loaded"


def test_every_number_key_of_every_table_refuses_inf_and_nan():
    """Not only the three above: each float key of the run config, read as TOML on this side."""
    refused = 0
    for section in dataclasses.fields(config.RunConfig):
        for key in dataclasses.fields(section.default_factory()):
            if not isinstance(getattr(section.default_factory(), key.name), float):
                continue
            for spelled in ("inf", "-inf", "nan"):
                with pytest.raises(ConfigError, match=rf"^{section.name}\.{key.name}: expected a finite number"):
                    config.from_dict(config.parse_toml(f"[{section.name}]\n{key.name} = {spelled}\n", "t"), env={})
                refused += 1
    assert refused >= 3 * 8  # learning_rate, weight_decay, dropout, the job's hours ... (8 float keys at least)
