"""Two stacks, one suite: which tests run in which environment.

The main environment (.venv) carries the current stack (payloads/requirements-gpu.txt); the frozen
trn1 lane's libraries (optimum-neuron 0.4.5 and its older pins, requirements-trn1-cpu.txt) live in
.venv/trn1-site, which `make test-trn1` puts first on PYTHONPATH. Tests marked `trn1` run only
there; tests marked `both_stacks` (payload code that also runs inside the trn1 image) run in both,
except those of them marked `main_stack` (they train with the torch engine, which the trn1 image does
not run); everything else runs in the main environment. Each invocation deselects what belongs to the other,
so a plain `pytest` never runs a neuron-lane test against the wrong library versions.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tools.tiny_model import HOST_THREADS

REPO = Path(__file__).resolve().parents[1]
# Every process a test starts (steps under the local Slurm, torchrun ranks, in-process training) with the
# rehearsal's thread count, set before anything imports torch: with make test's workers each training with a thread
# per core, OpenMP threads spun waiting on each other (a train step's CPU 12.3 -> 8.6 s; tools/tiny_model.py).
for _key, _value in HOST_THREADS.items():
    os.environ.setdefault(_key, _value)


def _share_botocore_loader() -> None:
    """One botocore data loader for every session this test process makes.

    hpctl (like any boto3 program) makes a session per command, and each session parses the service
    models (sagemaker's, ec2's: megabytes of JSON) again: a fifth of a second per test, hundreds of tests.
    The models are read-only files, so sharing their parsed form changes nothing a test can see.
    """
    import botocore.loaders
    import botocore.session

    class NoRepeats(list):
        def append(self, path):  # boto3 adds its own data folder to the loader of every new session
            if path not in self:
                super().append(path)

    made: dict = {}
    create = botocore.loaders.create_loader

    def shared(search_path_string=None):
        if search_path_string not in made:
            loader = create(search_path_string)
            loader._search_paths = NoRepeats(loader.search_paths)
            made[search_path_string] = loader
        return made[search_path_string]

    botocore.session.create_loader = shared


_share_botocore_loader()
TRN1_REQUIREMENTS = REPO / "requirements-trn1-cpu.txt"
REPORTED = ("transformers", "trl", "peft", "accelerate", "datasets", "huggingface-hub", "optimum-neuron", "torch")


def trn1_pins() -> dict[str, str]:
    """name -> version of requirements-trn1-cpu.txt."""
    lines = (line.split("#", 1)[0].strip() for line in TRN1_REQUIREMENTS.read_text().splitlines())
    return dict(line.split("==") for line in lines if line)


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def on_trn1_site() -> bool:
    """This interpreter imports the frozen lane's transformers (the trn1 site is first on the path)."""
    return installed("transformers") == trn1_pins()["transformers"] and installed("optimum-neuron") is not None


def pytest_report_header(config):
    lane = "frozen trn1 site (.venv/trn1-site)" if on_trn1_site() else "main stack"
    found = ", ".join(f"{name} {installed(name)}" for name in REPORTED if installed(name))
    return f"lane: {lane}: {found}"


def pytest_collection_modifyitems(config, items):
    trn1 = on_trn1_site()

    def belongs_here(item) -> bool:
        if item.get_closest_marker("trn1"):  # a trn1 test inside a both_stacks module stays on its lane
            return trn1
        if item.get_closest_marker("main_stack"):  # so does a main-stack one (the torch engine trains)
            return not trn1
        return True if item.get_closest_marker("both_stacks") else not trn1

    kept = [item for item in items if belongs_here(item)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not belongs_here(item)])
    # By module (the heaviest test of each), so a module's tests stay together and its fixtures are made once.
    heaviest: dict = {}
    for item in kept:
        heaviest[item.path] = min(heaviest.get(item.path, len(HEAVIEST_FIRST)), weight_class(item))
    items[:] = sorted(kept, key=lambda item: heaviest[item.path])  # stable: collection order within a class


# The longest work first, so that under `pytest -n 4 --dist loadgroup` (make test) the thousands of short tests fill the
# gaps at the end instead of one worker finishing a chain of minutes alone (longest processing time first).
# xdist would otherwise order its units by their number of tests (pytest_configure turns that off).
HEAVIEST_FIRST = ("rehearsal", "slurm", "engine", "xdist_group")


def weight_class(item) -> int:
    return next(
        (rank for rank, name in enumerate(HEAVIEST_FIRST) if item.get_closest_marker(name)), len(HEAVIEST_FIRST)
    )


def pytest_configure(config):
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems gives
