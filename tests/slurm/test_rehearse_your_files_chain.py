"""`make rehearse CONFIG=~/mydata/my-run.toml` for a normal user, as make runs it (sudo: root, SUDO_UID/SUDO_GID
of the user, here with the user's HOME): the whole chain rehearses the user's own records, named by a relative
data.dataset, with the tiny model, and writes nothing outside its root. Every file in the user's home (the
config's folder and the records beside it), and in the checkout minus what is not the user's (.rehearsal, the
install, git's metadata, caches), is checksummed before and after: nothing changed, nothing new. The absolute
form and the checks before the chain are tests/docs/test_rehearse_your_files.py (no chain)."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import REPO

from llm_pipeline.jobs.run_config_text import with_keys
from tools.local_slurm import kill_processes_of
from tools.rehearse import DEFAULT_CONFIG

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-rehearse_your_files")]
USER, UID = "hplyours", 46731  # no other test's uid (tests/slurm/test_teams.py: 461xx, 462xx)
RECORDS = 30
MARKER = "Which zeppelin carried the quokka"  # in every record of the user's, in no dolly stand-in record
# Not the user's files: the rehearsal's default root, the install, git's metadata and what Python and the test
# tools cache (other tests may write them meanwhile).
NOT_THE_USERS = {".rehearsal", ".venv", "node_modules", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
NOT_THE_USERS |= {".hypothesis", "cdk.out"}


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    """A normal user whose home is a fresh folder others may enter (the rehearsal's root is elsewhere)."""
    base = Path(tempfile.mkdtemp(prefix="hpl-your-files-"))
    base.chmod(0o755)
    subprocess.run(["groupadd", "-g", str(UID), USER], check=True)
    try:
        home = base / USER
        subprocess.run(["useradd", "-m", "-d", str(home), "-u", str(UID), "-g", str(UID), USER], check=True)
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], capture_output=True)
        subprocess.run(["groupdel", USER], capture_output=True)
        shutil.rmtree(base)


def checksums(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder`` (links not followed) by content, every folder by name."""
    found = {}
    for parent, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if name not in NOT_THE_USERS]
        for name in [*folders, *files]:
            path = Path(parent) / name
            if path.is_symlink():
                found[str(path)] = f"-> {os.readlink(path)}"
            elif path.is_file() and name not in NOT_THE_USERS:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                found[str(path)] = "folder"
    return found


def your_files(home: Path, owner: pwd.struct_passwd) -> Path:
    """~/mydata: the user's records and a run config naming them relative to itself, owned by the user."""
    mydata = home / "mydata"
    mydata.mkdir()
    rows = [{"instruction": f"{MARKER} {n}?", "context": "", "response": f"The number {n}."} for n in range(RECORDS)]
    (mydata / "records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    keys = {
        ("data", "dataset"): "records.jsonl",
        ("paths", "model_dir"): "models/base",  # the user's own model folder, relative: never written
        ("paths", "output_dir"): "${HPL_OUTPUTS_DIR}/my-run",
    }
    config = mydata / "my-run.toml"
    config.write_text(with_keys(DEFAULT_CONFIG.read_text(), keys))
    for path in (mydata, *mydata.iterdir()):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return config


def test_a_normal_users_rehearsal_trains_on_their_records_and_writes_nothing_outside_its_root(user, tmp_path):
    home = Path(user.pw_dir)
    config = your_files(home, user)
    root = tmp_path / "rehearsal"
    before = {**checksums(home), **checksums(REPO)}
    env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    env.update(
        PYTHONPATH=os.pathsep.join((str(REPO), str(REPO / "payloads"))),
        HOME=str(home),  # sudo may keep the user's HOME: nothing may land there either
        SUDO_UID=str(user.pw_uid),
        SUDO_GID=str(user.pw_gid),
        SUDO_USER=USER,
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tools.rehearse", "--root", str(root), "--config", str(config), "--tiny"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    finally:
        kill_processes_of(root / "slurm" / "slurm.conf")  # a failed run leaves no job behind
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    records = config.parent / "records.jsonl"
    said = [line for line in done.stdout.splitlines() if str(records) in line]
    assert said == [
        f"[2/4] rehearsing your dataset {records} ({RECORDS} records) with the tiny model, under {root / 'fsx'}"
    ]

    # The data step read the user's file, all of it, and the prepared copy holds their records.
    run = root / "fsx" / "outputs" / "my-run-tiny"
    (data_log,) = (run / "logs").glob("data-*.log")
    log = data_log.read_text()
    assert f"loading {records} (split train)" in log, log
    prepared = re.search(r"^prepared train (\d+), validation (\d+) rows in ", log, re.MULTILINE)
    assert prepared and int(prepared[1]) + int(prepared[2]) == RECORDS, log
    saved = b"".join(path.read_bytes() for path in (run / "data").glob("*/data-*.arrow"))  # the splits saved
    assert saved.count(MARKER.encode()) == RECORDS
    assert all(f"{MARKER} {n}?".encode() in saved for n in range(RECORDS))

    # Nothing outside the root changed or appeared; the root is handed to the user.
    after = {**checksums(home), **checksums(REPO)}
    assert {path: after.get(path) for path in before if after.get(path) != before[path]} == {}
    assert sorted(set(after) - set(before)) == []
    assert root.stat().st_uid == user.pw_uid and grp.getgrgid(root.stat().st_gid).gr_name == USER
