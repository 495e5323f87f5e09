"""The GPU lane's pins for the torch engine's tests: the folder `make venv` installs them into
(requirements-gpu-cpu.txt: where the CUDA image's libraries move ahead of the Neuron lane's, which
the shared environment carries), and how to train there on 1 or 2 gloo ranks.

The test process itself keeps the shared environment's versions; the engine runs in subprocesses
that put .venv/gpu-site first on PYTHONPATH, as torchtitan_site.py does for torchtitan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "gpu-site"
REQUIREMENTS = REPO / "requirements-gpu-cpu.txt"
PROBE = Path(__file__).with_name("torch_engine_probe.py")
LEAKED_PREFIXES = ("ACCELERATE_", "FSDP_")  # process-wide settings an in-process Trainer exported


def site_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python imports the GPU lane's pins first (and the payload package)."""
    missing = [line for line in pins() if not list(SITE.glob(f"{line.replace('-', '_')}-*.dist-info"))]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed in {SITE}: run `make venv`", pytrace=False)
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(LEAKED_PREFIXES)}
    paths = [str(SITE), str(REPO / "payloads"), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def pins() -> dict[str, str]:
    """name -> version of requirements-gpu-cpu.txt."""
    return dict(line.split("==") for line in REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#"))


def run_engine(run_configs: list[Path], out: Path, *, ranks: int, timeout: float = 600) -> dict[str, dict]:
    """Train each run config in turn with the torch engine on ``ranks`` gloo processes (one launch);
    the probe's answer per config file stem."""
    probe = [str(PROBE), *(f"--config={path}" for path in run_configs), "--out", str(out)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command = (launch if ranks > 1 else [sys.executable]) + probe
    done = subprocess.run(command, env=site_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())
