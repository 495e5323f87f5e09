"""Users and teams on a Slurm cluster: Linux accounts, their FSx folders, and Slurm's accounting side.

One owner for what a node and the local rehearsal (tools/local_slurm.py) both need: the slurm.conf
accounting and priority settings, slurmdbd.conf, the sacctmgr calls that make one account and QOS per
team and one association per user, and the users themselves. Runs on the node's own python3 (stdlib
only); the input is the users file the stack generates from cdk.json `users` and `teams`
(stacks/teams.py, the file named USERS_FILE):

    {"teams": [{"name": "research", "gid": 3001, "fairshare": 3, "max_nodes": 0, "max_gpu_minutes": 0}],
     "users": [{"name": "alice", "uid": 3101, "team": "research", "ssh_public_key": ""}]}

Commands (as root; bad input prints `error: ...` naming the file and exits 2; LIFECYCLE_ROOT prefixes /etc):
  count USERS_FILE                              how many users the file names (0: nothing to do)
  users USERS_FILE HOMES_DIR DEFAULT_USER       groups and users with their fixed ids; the cluster group
                                                (every user and the default user in it)
  layout USERS_FILE UID:GID FSX OUTPUTS SHARED...  the FSx folders, below (UID:GID the default user's;
                                                USERS_FILE may be absent: no teams)
  user-outputs                                  the profile's line that gives a user their own outputs folder
  slurm-settings USERS_FILE SLURM_CONF          the accounting and priority keys, set in slurm.conf
  associations USERS_FILE                       accounts, QOS and users in slurmdbd (sacctmgr)

The FSx layout (`layout`, ensure_layout) is all here, so the lifecycle and the tests run one code:
- shared inputs (models, the compile cache, images, scratch) and the capacity claims folder: owned by the
  default user and the cluster group, mode 2775 (setgid: what is made inside stays in the group) with a
  default ACL of group rwx, so files a job writes there are group-writable whatever the writer's umask: one
  user's model download or compile cache entries are completed and reused by another. Without users (no
  teams) the group is the default user's own;
- outputs: owned by the default user, 0755 (the default user's runs, as before; everyone passes through);
- <homes>/<user> and <outputs>/<user>: the user and their team's group, 2750 (they write, the team reads).
An existing folder keeps its content; its owner, group and mode are set to the layout's.
A users file may name the cluster group (`"cluster_group": {"name": ..., "gid": ...}`); else CLUSTER_GROUP.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import struct
import subprocess
import sys
from pathlib import Path

USERS_FILE = "cluster-users.json"
HOMES_FOLDER = "home"  # under the FSx mount: every node sees the same homes
# A team's runs land in its account; Slurm's default account (root) is left to the admin.
ACCOUNT_DESCRIPTION = "team {team} (cdk.json teams)"
# slurm.conf keys this module owns when the cluster has teams. Enforce: only known users and accounts
# run, and their QOS limits hold; "safe" keeps a job that would break a GrpTRESMins limit from starting.
# Multifactor priority with fair share dominating, so the teams' shares order what waits.
PRIORITY_SETTINGS = {
    "AccountingStorageEnforce": "associations,limits,qos,safe",
    "PriorityType": "priority/multifactor",
    "PriorityWeightFairshare": "10000",
    "PriorityWeightAge": "1000",
    "PriorityWeightQOS": "0",
    "PriorityDecayHalfLife": "7-0",
    "AccountingStorageTRES": "gres/gpu",
}
# The folders a user owns: writable by them alone; their team reads (setgid keeps new files in the team group).
USER_FOLDER_MODE = 0o2750
HOME_MODE = 0o2750
# Every cluster user's group, owner of the shared folders. Its gid is above the teams' range (stacks/teams.py:
# 2000-59999), so no team takes it.
CLUSTER_GROUP = {"name": "hplusers", "gid": 60000}
SHARED_MODE = 0o2775
OUTPUTS_MODE = 0o755
# The claims folder llm_pipeline.jobs.capacity uses under the FSx mount; a test keeps the two equal.
CAPACITY_FOLDER = "capacity"
# A default ACL of user rwx, group rwx, other r-x (the xattr's version-2 layout: tag, permissions, id per
# entry): inherited by all that is made below, it replaces the writer's umask, so files come out 664, dirs 2775.
ACL_XATTR = "system.posix_acl_default"
DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perms, 0xFFFFFFFF) for tag, perms in ((0x01, 7), (0x04, 7), (0x20, 5))
)


def user_outputs_dir(outputs_dir: str, user: str) -> str:
    """Where a users-file user's runs go: the profile's USER_OUTPUTS_LINE, and hpctl's dry run, both ask here."""
    return f"{outputs_dir}/{user}"


# The profile's last line: a user with an outputs folder of their own (a users-file user; not the default user,
# whose runs stay in outputs/) runs there, so a config's ${HPL_OUTPUTS_DIR}/<run> needs no edit.
_OWN = user_outputs_dir("$HPL_OUTPUTS_DIR", "$(id -un)")
USER_OUTPUTS_LINE = (
    f'if [ "$(id -un)" != "$HPL_DEFAULT_USER" ] && [ -d "{_OWN}" ] '
    f'&& [ -O "{_OWN}" ]; then export HPL_OUTPUTS_DIR="{_OWN}"; fi'
)


SSH_KEY = re.compile(r"(ssh-(ed25519|rsa)|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( [^\n]*)?")


class TeamsError(ValueError):
    """A users file or a system state this module cannot work with; the message says what to do."""


def load(path: Path) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TeamsError(f"cannot read the users file {path}: {error}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("teams"), list) or not isinstance(spec.get("users"), list):
        raise TeamsError(f"{path} must hold {{'teams': [...], 'users': [...]}} (the stack writes it from cdk.json)")
    teams = {team["name"] for team in spec["teams"]}
    for user in spec["users"]:
        if user["team"] not in teams:
            raise TeamsError(f"{path}: user {user['name']} names team {user['team']}, which the file does not define")
    return spec


def team_of(spec: dict) -> dict[str, dict]:
    return {team["name"]: team for team in spec["teams"]}


def cluster_group(spec: dict) -> dict:
    return spec.get("cluster_group") or CLUSTER_GROUP


# -- Linux users (every node) -------------------------------------------------------------------------
def _run(argv: list[str], *, stdin: str | None = None, env: dict | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise TeamsError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip() or done.stdout}")
    return done.stdout


def _entries(root: Path, name: str) -> dict[str, tuple[int, int]]:
    """<root>/etc/passwd or group as {name: (id, primary gid)} (a group's second field repeats its gid)."""
    found = {}
    for fields in _lines(root, name):
        if len(fields) >= 4 and fields[2].isdigit():
            found[fields[0]] = (int(fields[2]), int(fields[3]) if fields[3].isdigit() else int(fields[2]))
    return found


def _lines(root: Path, name: str) -> list[list[str]]:
    path = Path(root) / "etc" / name
    return [line.split(":") for line in path.read_text().splitlines()] if path.exists() else []


def _members(root: Path, group: str) -> set[str]:
    """The supplementary members <root>/etc/group lists for ``group``."""
    for fields in _lines(root, "group"):
        if fields[0] == group and len(fields) >= 4:
            return {name for name in fields[3].split(",") if name}
    return set()


def _ensure_group(name: str, gid: int, prefix: list[str], groups: dict, changed: list[str]) -> None:
    if name not in groups:
        _run(["groupadd", *prefix, "--gid", str(gid), name])
        changed.append(f"group {name} ({gid})")
    elif groups[name][0] != gid:
        raise TeamsError(f"group {name} has gid {groups[name][0]} on this node, the users file says {gid}")


def ensure_users(spec: dict, homes_dir: Path, root: Path = Path("/"), default_user: str = "") -> list[str]:
    """Each team a group and each user an account with the ids from the file, on this node; an existing
    name with another id is refused (ids must match on every node, or FSx ownership would lie). Every user,
    and ``default_user`` (the cluster's own, which must exist), joins the cluster group.
    ``root``: another system root (useradd --prefix), for tests."""
    prefix = [] if Path(root) == Path("/") else ["--prefix", str(root)]
    changed: list[str] = []
    groups = _entries(root, "group")
    for team in spec["teams"]:
        _ensure_group(team["name"], team["gid"], prefix, groups, changed)
    shared = cluster_group(spec)
    _ensure_group(shared["name"], shared["gid"], prefix, groups, changed)
    teams = team_of(spec)
    users = _entries(root, "passwd")
    for user in spec["users"]:
        gid = teams[user["team"]]["gid"]
        if user["name"] not in users:
            home = Path(homes_dir) / user["name"]
            _run(
                ["useradd", *prefix, "--uid", str(user["uid"]), "--gid", str(gid), "--groups", shared["name"],
                 "--home-dir", str(home), "--no-create-home", "--shell", "/bin/bash", user["name"]]
            )  # fmt: skip
            changed.append(f"user {user['name']} ({user['uid']})")
            continue
        uid, primary = users[user["name"]]
        if uid != user["uid"]:
            raise TeamsError(f"user {user['name']} has uid {uid} on this node, the users file says {user['uid']}")
        if primary != gid:
            _run(["usermod", *prefix, "--gid", str(gid), user["name"]])
            changed.append(f"user {user['name']} moved to team {user['team']}")
    members = _members(root, shared["name"])
    for name in [user["name"] for user in spec["users"]] + ([default_user] if default_user else []):
        if name not in members:
            if name not in users and name == default_user:
                raise TeamsError(f"default user {name} does not exist on this node (check default_user in the facts)")
            _run(["usermod", *prefix, "--append", "--groups", shared["name"], name])
            changed.append(f"user {name} joined group {shared['name']}")
    return changed


def _ensure_folder(folder: Path, uid: int, gid: int, mode: int, changed: list[str]) -> None:
    """``folder`` (made if missing; its content kept) owned by uid:gid with ``mode``."""
    if folder.exists() and not folder.is_dir():
        raise TeamsError(f"{folder} is not a folder: move it away, then provision the node again")
    folder.mkdir(parents=True, exist_ok=True)
    stat = folder.stat()
    if (stat.st_uid, stat.st_gid, stat.st_mode & 0o7777) != (uid, gid, mode):
        os.chown(folder, uid, gid)
        folder.chmod(mode)  # after chown, which clears setgid
        changed.append(f"{folder} {uid}:{gid} {mode:o}")


def _ensure_default_acl(folder: Path, changed: list[str]) -> None:
    try:
        if os.getxattr(folder, ACL_XATTR) == DEFAULT_ACL:
            return
    except OSError as error:
        if error.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
        if error.errno == errno.ENOTSUP:
            changed.append(f"{folder}: no POSIX ACLs on this file system: files keep their writer's umask")
            return
    os.setxattr(folder, ACL_XATTR, DEFAULT_ACL)
    changed.append(f"{folder} default ACL group rwx")


def ensure_layout(
    spec: dict | None,
    owner: tuple[int, int],
    fsx_dir: Path,
    outputs_dir: Path,
    shared_dirs: list[Path],
    root: Path = Path("/"),
) -> list[str]:
    """The FSx folders (the module's docstring says who owns what). ``spec``: the users file, None without one;
    ``owner``: the default user's uid and gid; ``shared_dirs``: the shared inputs (the capacity folder and the
    homes are under ``fsx_dir``)."""
    changed: list[str] = []
    homes_dir = Path(fsx_dir) / HOMES_FOLDER
    uid, gid = owner
    users = spec["users"] if spec else []
    group = gid
    if users:
        name = cluster_group(spec)["name"]
        if name not in _entries(root, "group"):
            raise TeamsError(f"group {name} is missing on this node: the teams step (`users`) creates it first")
        group = cluster_group(spec)["gid"]
    for folder in (Path(outputs_dir), Path(outputs_dir) / "logs"):
        _ensure_folder(folder, uid, gid, OUTPUTS_MODE, changed)
    for folder in [*map(Path, shared_dirs), Path(fsx_dir) / CAPACITY_FOLDER]:
        _ensure_folder(folder, uid, group, SHARED_MODE, changed)
        _ensure_default_acl(folder, changed)
    teams = team_of(spec) if spec else {}
    for user in users:
        user_uid, user_gid = user["uid"], teams[user["team"]]["gid"]
        for folder, mode in (
            (Path(homes_dir) / user["name"], HOME_MODE),
            (Path(outputs_dir) / user["name"], USER_FOLDER_MODE),
        ):
            _ensure_folder(folder, user_uid, user_gid, mode, changed)
        key = user.get("ssh_public_key", "")
        if key:
            ssh = Path(homes_dir) / user["name"] / ".ssh"
            ssh.mkdir(mode=0o700, exist_ok=True)
            keys = ssh / "authorized_keys"
            if not keys.exists() or keys.read_text() != key + "\n":
                keys.write_text(key + "\n")
                changed.append(f"{keys}")
            for path, mode in ((ssh, 0o700), (keys, 0o600)):
                os.chown(path, user_uid, user_gid)
                path.chmod(mode)
    return changed


# -- Slurm (controller) -------------------------------------------------------------------------------
def slurmdbd_conf(
    *,
    dbd_port: int,
    storage_host: str,
    storage_port: int,
    storage_user: str,
    storage_password: str,
    storage_db: str,
    slurm_user: str,
    log_file: Path,
    pid_file: Path,
    auth_info: str = "",
) -> str:
    """slurmdbd.conf: the one file that holds the database password; write it with :func:`write_private`."""
    lines = [
        "AuthType=auth/munge",
        *([f"AuthInfo={auth_info}"] if auth_info else []),
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={dbd_port}",
        f"SlurmUser={slurm_user}",
        "StorageType=accounting_storage/mysql",
        f"StorageHost={storage_host}",
        f"StoragePort={storage_port}",
        f"StorageUser={storage_user}",
        f"StoragePass={storage_password}",
        f"StorageLoc={storage_db}",
        f"LogFile={log_file}",
        f"PidFile={pid_file}",
    ]
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str, owner: str) -> None:
    """Write ``text`` readable by ``owner`` alone (0600): the file is created with that mode, never wider."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    entry = pwd.getpwnam(owner)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o600)


def accounting_settings(dbd_host: str, dbd_port: int) -> dict[str, str]:
    """slurm.conf keys for accounting through slurmdbd, with the teams' priority settings."""
    return {
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "AccountingStorageHost": dbd_host,
        "AccountingStoragePort": str(dbd_port),
        **PRIORITY_SETTINGS,
    }


def set_conf_keys(text: str, settings: dict[str, str]) -> str:
    """slurm.conf with each key of ``settings`` set: an existing line replaced in place, a missing one appended."""
    lines = text.splitlines()
    left = dict(settings)
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        match = next((name for name in left if name.lower() == key.lower()), None)
        if match and "=" in line and not line.lstrip().startswith("#"):
            lines[index] = f"{match}={left.pop(match)}"
    lines.extend(f"{key}={value}" for key, value in left.items())
    return "\n".join(lines) + "\n"


def qos_name(team: str) -> str:
    return f"{team}-qos"


def qos_limits(team: dict) -> list[str]:
    """sacctmgr qos fields for a team's limits; DenyOnLimit refuses an over-large job at submit."""
    limits = ["Flags=DenyOnLimit"]
    limits.append(f"MaxTRESPerJob=node={team['max_nodes']}" if team.get("max_nodes") else "MaxTRESPerJob=node=-1")
    minutes = team.get("max_gpu_minutes") or 0
    limits.append(f"GrpTRESMins=gres/gpu={minutes}" if minutes else "GrpTRESMins=gres/gpu=-1")
    return limits


def sacctmgr_calls(spec: dict, cluster: str) -> list[list[str]]:
    """The sacctmgr argument lists that make slurmdbd match the file: add what is missing (an add of
    something that exists changes nothing), then set each team's share and limits, then remove users
    the file no longer names. Run them in order with :func:`apply_associations`."""
    calls: list[list[str]] = [["add", "cluster", cluster]]
    for team in spec["teams"]:
        name = team["name"]
        calls.append(["add", "qos", qos_name(name)])
        calls.append(["modify", "qos", qos_name(name), "set", *qos_limits(team)])
        calls.append(
            [
                "add",
                "account",
                name,
                f"Description={ACCOUNT_DESCRIPTION.format(team=name)}",
                f"Organization={name}",
                f"Cluster={cluster}",
            ]
        )
        calls.append(
            [
                "modify",
                "account",
                name,
                "set",
                f"Fairshare={team['fairshare']}",
                f"QOS={qos_name(name)}",
                f"DefaultQOS={qos_name(name)}",
            ]
        )
    for user in spec["users"]:
        calls.append(
            [
                "add",
                "user",
                user["name"],
                f"Account={user['team']}",
                f"DefaultAccount={user['team']}",
                f"Cluster={cluster}",
            ]
        )
        calls.append(["modify", "user", user["name"], "set", f"DefaultAccount={user['team']}"])
    return calls


NOTHING_DONE = ("Nothing new added", "Nothing modified", "already exists", "Nothing deleted")


def apply_associations(spec: dict, cluster: str, env: dict | None = None) -> None:
    """Run :func:`sacctmgr_calls` (immediately, no prompt), then remove users and accounts the file dropped."""
    for call in sacctmgr_calls(spec, cluster):
        done = subprocess.run(["sacctmgr", "-i", *call], capture_output=True, text=True, env=env)
        said = done.stdout + done.stderr
        if done.returncode != 0 and not any(phrase in said for phrase in NOTHING_DONE):
            raise TeamsError(f"`sacctmgr -i {' '.join(call)}` failed (exit {done.returncode}): {said.strip()}")
    known_users = {user["name"] for user in spec["users"]}
    listed = _run(["sacctmgr", "-n", "-P", "list", "associations", "format=account,user"], env=env)
    team_names = {team["name"] for team in spec["teams"]}
    for line in listed.splitlines():
        account, _, user = line.partition("|")
        if user and account in team_names and user not in known_users:
            _run(["sacctmgr", "-i", "delete", "user", user, f"Account={account}"], env=env)


def scontrol_config(env: dict | None = None) -> dict[str, str]:
    """`scontrol show config` as a dict (what slurmctld runs with, not what the file says)."""
    pairs = {}
    for line in _run(["scontrol", "show", "config"], env=env).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def main(argv: list[str]) -> int:
    try:
        command, *args = argv
        # No users file is a cluster without teams: the layout still runs.
        spec = load(Path(args[0])) if args and (command != "layout" or Path(args[0]).is_file()) else None
        if command == "user-outputs":
            changes = [USER_OUTPUTS_LINE]
        elif command == "layout":
            uid, _, gid = args[1].partition(":")
            root = Path(os.environ.get("LIFECYCLE_ROOT") or "/")
            changes = ensure_layout(spec, (int(uid), int(gid)), Path(args[2]), Path(args[3]), args[4:], root)
        elif command == "count":
            changes = [str(len(spec["users"]))]
        elif command == "users":
            changes = ensure_users(spec, Path(args[1]), Path(os.environ.get("LIFECYCLE_ROOT") or "/"), args[2])
        elif command == "slurm-settings":
            conf = Path(args[1])
            old = conf.read_text()
            new = set_conf_keys(old, PRIORITY_SETTINGS if spec["teams"] else {})
            changes = [] if new == old else [f"{conf}: {', '.join(PRIORITY_SETTINGS)}"]
            if changes:
                conf.write_text(new)
        elif command == "associations":
            cluster = scontrol_config().get("ClusterName", "")
            if scontrol_config().get("AccountingStorageType") != "accounting_storage/slurmdbd":
                raise TeamsError(
                    "slurmctld runs without slurmdbd (AccountingStorageType is not accounting_storage/slurmdbd): "
                    "teams need Slurm accounting, which HyperPod sets up on the controller in continuous "
                    "provisioning mode (or the external database of config key accounting_database)"
                )
            apply_associations(spec, cluster)
            changes = [f"{len(spec['teams'])} accounts, {len(spec['users'])} users in slurmdbd for {cluster}"]
        else:
            raise TeamsError(
                f"unknown command {command!r}: users, layout, user-outputs, slurm-settings or associations"
            )
    except (TeamsError, ValueError, IndexError, KeyError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for change in changes:
        print(change)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
