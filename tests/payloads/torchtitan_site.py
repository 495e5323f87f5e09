"""torchtitan 0.2.2 for the tests: the folder `make venv` installs it into, and how to run code there.

torchtitan's tyro needs typeguard >= 4 while jsii pins typeguard 2.13.3, so torchtitan lives in
.venv/torchtitan-site (requirements-torchtitan-cpu.txt) and runs in subprocesses that put that
folder first on PYTHONPATH; the test process itself never imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "torchtitan-site"
PROBE = Path(__file__).with_name("torchtitan_probe.py")


def site_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python imports torchtitan 0.2.2 (and the payload package)."""
    if not (SITE / "torchtitan" / "__init__.py").is_file():
        pytest.fail(f"torchtitan 0.2.2 is not installed in {SITE}: run `make venv`", pytrace=False)
    env = dict(os.environ if base is None else base)
    paths = [str(SITE), str(REPO / "payloads"), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def probe(*args: str, timeout: float = 180) -> object:
    """Run tests/payloads/torchtitan_probe.py with torchtitan importable; its JSON answer."""
    out = subprocess.run(
        [sys.executable, str(PROBE), *args], env=site_env(), capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)
