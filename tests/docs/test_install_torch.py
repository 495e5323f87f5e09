"""tools/install_torch.sh: torch's CPU build from PyTorch's CPU index; where that index does not answer, one line
says so and pip's own sources are used only when they hold a CPU build, never a CUDA one.

The index is a local HTTP folder (what pip reads from download.pytorch.org/whl/cpu), the wheels are tiny ones
with the real names and metadata of each build, and pip is the real pip of a fresh venv."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from tests.local_http import serving

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install_torch.sh"
PIN = "2.13.0"
CUDA_REQUIRES = ("nvidia-cublas==13.1.0.3", "triton==3.9.0")


def write_wheel(folder: Path, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel of torch ``version`` whose metadata requires ``requires`` (a CUDA build requires nvidia-*)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    metadata = "\n".join(
        ["Metadata-Version: 2.1", "Name: torch", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    )
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": metadata + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    path = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("install-torch") / "venv"
    subprocess.run([sys.executable, "-m", "venv", folder], check=True)
    return folder / "bin" / "python"


@pytest.fixture
def venv(fresh_venv) -> Iterator[Path]:
    """A venv without torch (one for the module: each test takes out the torch it installed)."""
    yield fresh_venv
    subprocess.run([fresh_venv, "-m", "pip", "uninstall", "-q", "-y", "torch"], env=pip_env(), capture_output=True)


@pytest.fixture
def requirements(tmp_path) -> Path:
    path = tmp_path / "requirements.txt"
    path.write_text(f"# the main stack\ntorch=={PIN}\ntransformers==5.24.0\n")
    return path


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index address that accepts the connection and never answers (a firewall that drops, a dead proxy)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/whl/cpu"


def pip_env(**more: str) -> dict[str, str]:
    """No pip configuration of this machine's: only the sources a test names."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **more}


def install(venv: Path, requirements: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, venv, requirements], env=env, capture_output=True, text=True, timeout=120)


def installed_torch(venv: Path) -> str | None:
    done = subprocess.run(
        [venv, "-c", "import importlib.metadata as m; print(m.version('torch'))"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


def test_the_cpu_build_comes_from_pytorchs_cpu_index(tmp_path, venv, requirements):
    index = tmp_path / "index"
    write_wheel(index / "torch", f"{PIN}+cpu")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(index))
    with serving(handler) as url:  # pip reads the folder listing as a simple index
        done = install(venv, requirements, pip_env(HPL_TORCH_INDEX=url))
    assert done.returncode == 0, done.stderr
    assert f"torch {PIN}+cpu (CPU build) from {url}/torch/" in done.stdout and "note:" not in done.stdout
    assert installed_torch(venv) == f"{PIN}+cpu"
    again = install(venv, requirements, pip_env(HPL_TORCH_INDEX="http://127.0.0.1:9"))
    assert again.returncode == 0 and again.stdout == f"torch {PIN}+cpu is installed already\n"


def test_an_index_that_never_answers_is_named_in_one_line_and_a_cpu_wheel_on_disk_is_used(
    tmp_path, venv, requirements, silent_index
):
    write_wheel(tmp_path / "wheels", f"{PIN}+cpu")
    started = time.monotonic()
    env = pip_env(HPL_TORCH_INDEX=silent_index, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "wheels"))
    done = install(venv, requirements, env)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60  # the probe gives up after seconds, pip does the rest
    (note,) = [line for line in done.stdout.splitlines() if line.startswith("note:")]
    assert f"PyTorch's CPU index {silent_index} is unreachable (timed out)" in note
    assert "falling back to pip's configured sources" in note
    assert installed_torch(venv) == f"{PIN}+cpu"


def test_a_cuda_build_is_refused_in_one_line_and_nothing_is_installed(tmp_path, venv, requirements):
    write_wheel(tmp_path / "wheels", PIN, CUDA_REQUIRES)  # PyPI's Linux torch: no local tag, nvidia-* requirements
    env = pip_env(HPL_TORCH_INDEX="http://127.0.0.1:9", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "wheels"))
    done = install(venv, requirements, env)
    assert done.returncode == 2
    (error,) = done.stderr.splitlines()
    assert error.startswith(f"error: the only torch {PIN} that pip finds here is a CUDA build (file://")
    assert "nothing was installed" in error and "PIP_FIND_LINKS=" in error
    # The other way, as a command to paste: this venv's pip, the pin.
    assert error.endswith(f"(this CUDA build, several GB: {venv} -m pip install torch=={PIN})")
    assert installed_torch(venv) is None


def test_a_file_without_a_torch_pin_is_named(tmp_path, venv):
    (tmp_path / "nopin.txt").write_text("transformers==5.24.0\n")
    done = install(venv, tmp_path / "nopin.txt", pip_env())
    assert done.returncode == 2 and done.stderr == f"error: {tmp_path / 'nopin.txt'} pins no torch==<version>\n"
