"""Put the pinned tomli wheel beside llm_pipeline/config.py, where the payload upload carries it to the controller.

The controller's python3 (3.10) has no tomllib; config.toml_reader imports tomli from this wheel there. It is
third-party code, so it is fetched from the package index at install (`make venv`) rather than kept in git, and
accepted only with the digest pinned beside its name (config.TOMLI_WHEEL, config.TOMLI_WHEEL_SHA256).

    python -m tools.ship_tomli      (a no-op when the pinned file is in place)
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from llm_pipeline import config

TARGET = Path(config.__file__).with_name(config.TOMLI_WHEEL)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    if TARGET.is_file() and digest(TARGET) == config.TOMLI_WHEEL_SHA256:
        print(f"    {TARGET.name} in place")
        return 0
    version = config.TOMLI_WHEEL.split("-")[1]
    with tempfile.TemporaryDirectory(prefix="hpl-tomli-") as scratch:
        command = [sys.executable, "-m", "pip", "download", "--progress-bar", "off", "--no-deps"]
        # the pure-Python wheel (tomli also publishes compiled ones for each CPython): what a 3.10 imports from a zip
        command += ["--only-binary=:all:", "--platform", "any", "--implementation", "py", "--python-version", "3.10"]
        command += ["--dest", scratch, f"tomli=={version}"]
        subprocess.run(command, check=True)
        fetched = Path(scratch) / config.TOMLI_WHEEL
        if not fetched.is_file():
            print(
                f"error: pip did not fetch {config.TOMLI_WHEEL} (got {sorted(Path(scratch).iterdir())})",
                file=sys.stderr,
            )
            return 1
        if digest(fetched) != config.TOMLI_WHEEL_SHA256:
            print(
                f"error: {config.TOMLI_WHEEL} from the index is not the pinned file (sha256 differs)", file=sys.stderr
            )
            return 1
        shutil.copyfile(fetched, TARGET)
    print(f"    {TARGET.name} -> {TARGET.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
