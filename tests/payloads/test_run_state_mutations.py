"""The mutation gate of the run-state guards: for each guard in GUARDS, its source mutated in a temporary copy of
payloads/llm_pipeline must make its own focused tests fail (run by pytest against the copy: the ini's pythonpath
pointed at it). A guard whose mutation passes them is a guard the suite does not hold. docs/testing.md lists the
guards and their tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# some guards' own tests train the tiny model; one runner serves every test here
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("run_state_mutations")]
IMPORT_CHECK = "the focused tests import the copy"


@dataclass(frozen=True)
class Guard:
    name: str
    file: str  # under payloads/llm_pipeline
    original: str  # found exactly once
    mutated: str
    tests: tuple[str, ...]  # node ids, relative to the repository root: at least one must fail


GUARDS = (
    Guard(
        "finished marker: written only at the checkpoint's own end",
        "run_state.py",
        "if newest is None or not at_its_end(newest):",
        "if newest is None:",
        (
            "tests/payloads/test_run_state.py::test_the_marker_is_written_only_at_the_checkpoints_own_end_and_copies_its_record",
        ),
    ),
    Guard(
        "changed key: a learning key other than the checkpoint's record is refused",
        "run_state.py",
        "if key in learned.get(section, {}) and learned[section][key] != old",
        "if False",
        (
            "tests/payloads/test_run_state.py::test_a_finished_run_resubmitted_with_a_learning_key_changed_is_refused_naming_it",
        ),
    ),
    Guard(
        "changed content: inputs other than the checkpoint's record are refused",
        "run_state.py",
        "and then.inputs[name] != now.inputs[name]",
        "and False",
        ("tests/payloads/test_run_state.py::test_refilled_model_weights_are_refused_naming_them",),
    ),
    Guard(
        "grace skip: a non-finite step's update is skipped",
        "training/torch/backend.py",
        "skip_update(self, model, skip=self.loss_guard.is_bad(step))",
        "skip_update(self, model, skip=False)",
        (
            "tests/payloads/test_run_life.py::test_a_nan_at_step_4_within_the_grace_is_skipped_as_if_the_step_never_updated",
        ),
    ),
    Guard(
        "bad-step save: a non-finite step gets no checkpoint",
        "training/loss_guard.py",
        "control.should_save = False",
        "pass",
        ("tests/payloads/test_train_nonfinite.py::test_within_the_grace_a_nan_loss_is_logged_as_nan_and_not_saved",),
    ),
    Guard(
        "extension: a raised train.max_steps trains on from the finished checkpoint",
        "run_state.py",
        'return train["max_steps"] > record.step',
        "return False",
        ("tests/payloads/test_run_state.py::test_an_extension_trains_on_and_is_finished_again_only_at_its_new_end",),
    ),
    Guard(
        "lock: one submission of a run at a time",
        "jobs/run_lock.py",
        "except FileExistsError:\n            return False",
        "except FileExistsError:\n            return True",
        ("tests/jobs/test_run_lock.py::test_a_second_holder_waits_then_is_refused_in_one_line_naming_the_holder",),
    ),
)

_FAILED = re.compile(r"^FAILED (\S+)", re.MULTILINE)
_IGNORE = shutil.ignore_patterns("__pycache__")


RUNNER = Path(__file__).with_name("mutation_runner.py")


def _pytest(jobs: list[tuple[Path, tuple[str, ...]]], folder: Path) -> list[tuple[int, str]]:
    """pytest in the repository once per (payloads copy, args), each importing llm_pipeline from its copy (the
    ini's pythonpath): (exit status, output) per job. Each job is a fresh process forked from one runner that
    imported the heavy libraries once (mutation_runner.py)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "COV_"))}
    # The copy first; the real payloads folder after it, so conftests that add it when missing (tests/jobs) find it
    # there and put nothing ahead of the copy.
    options = ["-q", "-rf", "-p", "no:cacheprovider", "-p", "no:xdist"]
    specs = [
        {"pythonpath": f"{payloads} . payloads", "args": [*options, *args], "log": str(folder / f"job-{n}.log")}
        for n, (payloads, args) in enumerate(jobs)
    ]
    (folder / "jobs.json").write_text(json.dumps(specs))
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(folder / "jobs.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = json.loads(done.stdout.strip().splitlines()[-1])
    return [(status, Path(spec["log"]).read_text()) for status, spec in zip(statuses, specs, strict=True)]


def mutated_copy(guard: Guard, folder: Path) -> Path:
    """payloads/llm_pipeline copied under ``folder``/payloads with the guard's mutation; the copy's payloads path."""
    payloads = folder / "payloads"
    shutil.copytree(ROOT / "payloads" / "llm_pipeline", payloads / "llm_pipeline", ignore=_IGNORE)
    source = payloads / "llm_pipeline" / guard.file
    text = source.read_text()
    assert text.count(guard.original) == 1, f"{guard.file}: the guard's source moved; update GUARDS ({guard.name})"
    source.write_text(text.replace(guard.original, guard.mutated))
    return payloads


def import_check_copy(folder: Path) -> tuple[Path, tuple[str, ...]]:
    """A copy that refuses to be imported, and one focused test file of each test folder GUARDS names, collected."""
    payloads = folder / "payloads"
    shutil.copytree(ROOT / "payloads" / "llm_pipeline", payloads / "llm_pipeline", ignore=_IGNORE)
    with (payloads / "llm_pipeline" / "__init__.py").open("a") as init:
        init.write('\nraise RuntimeError("imported from the copy")\n')
    folders = sorted({guard.tests[0].rsplit("/", 1)[0] for guard in GUARDS})
    files = [next(guard.tests[0].split("::")[0] for guard in GUARDS if guard.tests[0].startswith(f"{folder}/"))
             for folder in folders]  # fmt: skip
    return payloads, ("--collect-only", *files)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """guard name (and IMPORT_CHECK) -> (pytest's exit status, its output) of its focused tests on its copy."""
    folder = tmp_path_factory.mktemp("mutations")
    jobs = {guard.name: (mutated_copy(guard, folder / f"guard-{n}"), guard.tests) for n, guard in enumerate(GUARDS)}
    jobs[IMPORT_CHECK] = import_check_copy(folder / "import-check")
    return dict(zip(jobs, _pytest(list(jobs.values()), folder), strict=True))


@pytest.mark.parametrize("guard", GUARDS, ids=[guard.name.split(":")[0] for guard in GUARDS])
def test_the_guards_tests_catch_its_mutation(guard, verdicts):
    status, out = verdicts[guard.name]
    failed = set(_FAILED.findall(out))
    assert status == 1 and failed & set(guard.tests), (
        f"the mutation of '{guard.name}' was not caught by {', '.join(guard.tests)}:\n{out[-3000:]}"
    )


def test_every_guard_names_tests_that_exist():
    for guard in GUARDS:
        for test in guard.tests:
            path, _, name = test.partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), test


def test_the_guards_tests_import_the_copy(verdicts):
    """What makes every verdict above mean something: the focused tests import llm_pipeline from the copy (here a
    copy that refuses to be imported), in every test folder GUARDS names."""
    status, out = verdicts[IMPORT_CHECK]
    files = len({guard.tests[0].rsplit("/", 1)[0] for guard in GUARDS})
    assert status != 0 and out.count("imported from the copy") >= files, out[-3000:]


def test_docs_testing_lists_every_guard_and_its_test():
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text[text.index("## The run-state guards and their mutation gate") :]
    rows = re.findall(r"^\| ([a-z -]+) \| [^|]+ \| `([^`]+)` \|$", section, re.MULTILINE)
    documented = {name: test for name, test in rows}
    assert documented == {guard.name.split(":")[0]: guard.tests[0].removeprefix("tests/payloads/") for guard in GUARDS}
