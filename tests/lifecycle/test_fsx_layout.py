"""The FSx layout (lifecycle/slurm_teams.py ensure_layout, the code on_init_complete.sh runs): who owns each
folder, its mode and setgid, the default ACL that keeps shared files group-writable, a second run that changes
nothing, and an existing folder taken over while its content keeps its owners."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lifecycle_node import LIFECYCLE_DIR

from lifecycle import slurm_teams
from llm_pipeline.jobs import capacity
from tests.needs_root import require_root

DEFAULT = (4242, 4242)  # the default user's uid and gid
CLUSTER = {"name": "hpltestall", "gid": 46390}
SPEC = {
    "teams": [{"name": "research", "gid": 46391}],
    "users": [{"name": "alice", "uid": 46392, "team": "research"}],
    "cluster_group": CLUSTER,
}
SHARED = ("models", "neuron-cache", "images", "scratch")
OTHER_UID = 46393  # someone else: a user who made a folder before the lifecycle did


@pytest.fixture
def fsx() -> Iterator[Path]:
    """A node root with the cluster group in its /etc/group, world-searchable (a normal user reads the profile's
    folders under it)."""
    require_root("the layout tests (they change file ownership as the lifecycle does on a node)")
    root = Path(tempfile.mkdtemp(prefix="hpl-layout-"))
    root.chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc/group").write_text(f"{CLUSTER['name']}:x:{CLUSTER['gid']}:alice\n")
    (root / "fsx").mkdir()
    yield root / "fsx"
    shutil.rmtree(root)


def layout(fsx: Path, spec: dict | None = SPEC) -> list[str]:
    shared = [fsx / name for name in SHARED]
    return slurm_teams.ensure_layout(spec, DEFAULT, fsx, fsx / "outputs", shared, root=fsx.parent)


def owner_group_mode(path: Path) -> tuple[int, int, str]:
    info = path.stat()
    return info.st_uid, info.st_gid, oct(info.st_mode & 0o7777)


def snapshot(fsx: Path) -> dict[str, tuple]:
    return {
        str(path): (*owner_group_mode(path), path.stat().st_mtime_ns, os.listxattr(path))
        for path in [fsx, *fsx.rglob("*")]
    }


def test_shared_folders_belong_to_the_cluster_group_setgid_and_group_writable(fsx: Path) -> None:
    layout(fsx)
    for name in (*SHARED, slurm_teams.CAPACITY_FOLDER):
        assert owner_group_mode(fsx / name) == (*DEFAULT[:1], CLUSTER["gid"], "0o2775"), name
        assert os.getxattr(fsx / name, slurm_teams.ACL_XATTR) == slurm_teams.DEFAULT_ACL, name
    for name in ("outputs", "outputs/logs"):  # the default user's runs: they write, everyone passes through
        assert owner_group_mode(fsx / name) == (*DEFAULT, "0o755"), name
    for name in ("outputs/alice", "home/alice"):  # a user's own: they write, their team reads
        assert owner_group_mode(fsx / name) == (46392, 46391, "0o2750"), name


def test_without_users_the_shared_group_is_the_default_users_own(fsx: Path) -> None:
    layout(fsx, spec=None)
    assert owner_group_mode(fsx / "models") == (*DEFAULT, "0o2775")
    assert not (fsx / "home").exists()


def test_what_one_user_writes_in_a_shared_folder_another_can_complete(fsx: Path) -> None:
    """The default ACL replaces the writer's umask (even 077): a download's folder and files come out group
    rw, in the cluster group, so a second user can finish or reuse them."""
    layout(fsx)
    before = os.umask(0o077)
    try:
        (fsx / "models/Meta-Llama-3-8B").mkdir()
        (fsx / "models/Meta-Llama-3-8B/model-00001.safetensors").write_bytes(b"x")
    finally:
        os.umask(before)
    assert owner_group_mode(fsx / "models/Meta-Llama-3-8B")[1:] == (CLUSTER["gid"], "0o2775")
    assert owner_group_mode(fsx / "models/Meta-Llama-3-8B/model-00001.safetensors")[1:] == (CLUSTER["gid"], "0o664")


def test_a_second_run_changes_nothing(fsx: Path) -> None:
    assert layout(fsx)
    before = snapshot(fsx)
    assert layout(fsx) == []
    assert snapshot(fsx) == before


def test_an_existing_folder_is_taken_over_and_its_content_keeps_its_owner(fsx: Path) -> None:
    """A capacity folder the first claimer made (before the lifecycle made it): the layout's owner, group and
    mode; the claims file inside stays that user's, and nothing in it is lost."""
    claims = fsx / slurm_teams.CAPACITY_FOLDER / "compute.json"
    claims.parent.mkdir()
    claims.write_text('{"claims": {}}')
    for path in (claims.parent, claims):
        os.chown(path, OTHER_UID, OTHER_UID)
    claims.parent.chmod(0o755)
    layout(fsx)
    assert owner_group_mode(claims.parent) == (DEFAULT[0], CLUSTER["gid"], "0o2775")
    assert owner_group_mode(claims)[:2] == (OTHER_UID, OTHER_UID) and claims.read_text() == '{"claims": {}}'


def test_a_missing_cluster_group_stops_the_layout_in_one_line(fsx: Path) -> None:
    users = fsx.parent / "cluster-users.json"
    users.write_text(
        '{"teams": [{"name": "research", "gid": 46391}], '
        '"users": [{"name": "alice", "uid": 46392, "team": "research"}]}'
    )  # the default cluster group, which this root's /etc/group lacks
    done = subprocess.run(
        [sys.executable, str(LIFECYCLE_DIR / "slurm_teams.py"), "layout", str(users), "4242:4242", str(fsx),
         str(fsx / "outputs"), str(fsx / "models")],
        env={**os.environ, "LIFECYCLE_ROOT": str(fsx.parent)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"error: group {slurm_teams.CLUSTER_GROUP['name']} is missing on this node: "
        "the teams step (`users`) creates it first\n"
    )


def test_the_capacity_folder_is_where_the_claims_go() -> None:
    """lifecycle/ ships to the nodes alone, so it names the folder itself: the same as capacity's default."""
    group = capacity.Group(name="compute", partition="local", floor=0, ceiling=1)
    claims = capacity.claims_path({"HPL_FSX_MOUNT_PATH": "/fsx"}, group)
    assert claims.parent == Path("/fsx") / slurm_teams.CAPACITY_FOLDER


def test_a_team_users_profile_points_outputs_at_their_own_folder(fsx: Path) -> None:
    """The profile's line: a user with their own outputs folder runs there; the default user, and a user without
    one, keep the shared outputs folder."""
    layout(fsx)
    (fsx / "outputs/nobody").mkdir()
    os.chown(fsx / "outputs/nobody", 65534, 65534)

    def outputs(user: str, default_user: str = "ubuntu") -> str:
        script = f"HPL_OUTPUTS_DIR={fsx / 'outputs'} HPL_DEFAULT_USER={default_user}\n{slurm_teams.USER_OUTPUTS_LINE}"
        argv = ["runuser", "-u", user, "--", "sh", "-c", f'{script}\necho "$HPL_OUTPUTS_DIR"']
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    assert outputs("nobody") == str(fsx / "outputs/nobody")
    assert outputs("nobody", default_user="nobody") == str(fsx / "outputs")
    assert outputs("root") == str(fsx / "outputs")
