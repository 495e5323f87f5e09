"""The sites beside the venv hold exactly what their files pin, on whichever Python made them (`make venv`: the
venv's; CI also builds them on 3.12, tools/check_python312.sh): .venv/trn1-site (requirements-trn1-cpu.txt) and
.venv/torchtitan-site (requirements-torchtitan-cpu.txt). optimum-neuron 0.4.5 declares Python < 3.12 and is
installed past that check, so its modules must at least compile on this Python."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SITES = {"trn1-site": "requirements-trn1-cpu.txt", "torchtitan-site": "requirements-torchtitan-cpu.txt"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: str) -> dict[str, str]:
    lines = (line.split("#", 1)[0].strip() for line in (REPO / requirements).read_text().splitlines())
    return {canonical(name): version for name, version in (line.split("==") for line in lines if line)}


def site(name: str) -> Path:
    folder = Path(sys.prefix) / name
    if not folder.is_dir():
        pytest.fail(f"{folder} is missing: run `make venv`", pytrace=False)
    return folder


@pytest.mark.parametrize("name", sorted(SITES))
def test_each_site_holds_exactly_its_pins(name):
    installed = importlib.metadata.distributions(path=[str(site(name))])
    found = {canonical(dist.metadata["Name"]): dist.version for dist in installed}
    assert found == pins(SITES[name])


def test_optimum_neuron_compiles_on_this_python():
    package = site("trn1-site") / "optimum" / "neuron"
    modules = sorted(package.rglob("*.py"))
    assert len(modules) > 100
    with warnings.catch_warnings():  # its own invalid escapes ('\\.') warn; only a syntax error fails
        warnings.simplefilter("ignore")
        for module in modules:
            compile(module.read_bytes(), str(module), "exec")
