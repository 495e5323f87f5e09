"""Paths and parsing shared by the training-image tests (a uniquely named module, so importing it
cannot collide with another area's conftest)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

PAYLOADS = Path(__file__).resolve().parents[2] / "payloads"
DOCKERFILE = PAYLOADS / "Dockerfile"
REQUIREMENTS = PAYLOADS / "requirements-cluster.txt"
CUDA_DOCKERFILE = PAYLOADS / "Dockerfile.cuda"
GPU_REQUIREMENTS = PAYLOADS / "requirements-gpu.txt"
TRN2_DOCKERFILE = PAYLOADS / "Dockerfile.trn2"
TRN2_REQUIREMENTS = PAYLOADS / "requirements-trn2.txt"
VERIFY_ENV = PAYLOADS / "image" / "verify_env.py"


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and blanks dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # Docker drops these inside continuations too
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), re.sub(r"\s+", " ", arguments).strip()))
        pending = ""
    if pending:
        raise ValueError("Dockerfile ends inside a continued line")
    return instructions


def load_verify_env():
    """The build-time check module, loaded from payloads/image/ (it is not an installed package)."""
    spec = importlib.util.spec_from_file_location("image_verify_env", VERIFY_ENV)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hadolint_findings(dockerfile: Path) -> str:
    """hadolint's report on a Dockerfile (the binary beside this interpreter); empty when clean."""
    import subprocess
    import sys

    result = subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), str(dockerfile)], capture_output=True, text=True
    )
    return "" if result.returncode == 0 else result.stdout + result.stderr
