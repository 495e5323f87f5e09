"""Two team users run the default chain at the same time on the cluster's own FSx layout.

The FSx tree, the users and the cluster group are made by the lifecycle's own code (lifecycle/slurm_teams.py:
ensure_users, ensure_layout); each user's HPL_OUTPUTS_DIR comes from the profile line the lifecycle installs.
Both users submit the same run config, unedited (the rehearsal's tiny CPU chain: the download stand-in ->
evaluate), on a group that scales with runs (the local Slurm's node scaler), so both claim in the one claims
folder. One user writes the shared model (the download stand-in, as that user); the other's chain reuses it.
The other's chain ends after its merge (submitted `--to merge`: the writer's chain runs generate and evaluate
as a team user on the same layout).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from slurm_helpers import REPO, RUN_STEPS, wait_for

from lifecycle import slurm_teams
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.run_files import SubmittedLine
from stacks.teams import users_file
from tools.local_slurm import LocalSlurm, missing_binaries
from tools.rehearse import DEFAULT_CONFIG, fsx_environment

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("slurm-team-chains")]

TEAMS = [{"name": "hplcteama", "gid": 46301, "fairshare": 1}, {"name": "hplcteamb", "gid": 46302, "fairshare": 1}]
USERS = [
    {"name": "hplcusera", "uid": 46311, "team": "hplcteama"},
    {"name": "hplcuserb", "uid": 46312, "team": "hplcteamb"},
]
CLUSTER_GROUP = {"name": "hplcall", "gid": 46300}
DEFAULT_USER, DEFAULT_ID = "hplcdefault", 46320  # the cluster's default user (ubuntu on HyperPod)
WRITER, READER = USERS[0]["name"], USERS[1]["name"]
RUN = "tiny-lora"


def remove_accounts() -> None:
    for name in [user["name"] for user in USERS] + [DEFAULT_USER]:
        subprocess.run(["userdel", name], capture_output=True)
    for name in [team["name"] for team in TEAMS] + [CLUSTER_GROUP["name"], DEFAULT_USER]:
        subprocess.run(["groupdel", name], capture_output=True)


def user_python() -> str:
    """An interpreter the test users can run: this one, or (when it lives under root's home, as pyenv's does)
    the system's of the same version; either finds this venv's packages on PYTHONPATH."""
    probe = subprocess.run(["runuser", "-u", WRITER, "--", sys.executable, "-c", "pass"], capture_output=True)
    return sys.executable if probe.returncode == 0 else f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


def as_user(user: str, env: dict[str, str], *argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(["runuser", "-u", user, "--", *argv], env=env, cwd=REPO / "payloads", text=True, **kwargs)


@pytest.fixture(scope="module")
def team_fsx():
    missing = missing_binaries(accounting=True)
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run tools/system_packages.sh (as root)", pytrace=False)
    spec = {**users_file(TEAMS, USERS), "cluster_group": CLUSTER_GROUP}
    root = Path(tempfile.mkdtemp(prefix="hpl-team-chains-"))  # short and world-searchable: the users' jobs run here
    root.chmod(0o755)
    remove_accounts()
    try:
        subprocess.run(["groupadd", "--gid", str(DEFAULT_ID), DEFAULT_USER], check=True)
        subprocess.run(["useradd", "--uid", str(DEFAULT_ID), "--gid", str(DEFAULT_ID), DEFAULT_USER], check=True)
        fsx = root / "fsx"
        env = fsx_environment(fsx)
        slurm_teams.ensure_users(spec, fsx / slurm_teams.HOMES_FOLDER, default_user=DEFAULT_USER)
        shared = [Path(env[name]) for name in ("HPL_MODELS_DIR", "HPL_COMPILE_CACHE_DIR")]
        shared += [Path(env[name]) for name in ("HPL_IMAGES_DIR", "HPL_SCRATCH_DIR")]
        slurm_teams.ensure_layout(spec, (DEFAULT_ID, DEFAULT_ID), fsx, Path(env["HPL_OUTPUTS_DIR"]), shared)
        with LocalSlurm(root / "slurm", nodes=2, cpus_per_node=2, teams=spec) as slurm:
            for user in USERS:  # the scaler stand-in resumes and drains nodes, which takes a Slurm admin; on
                # HyperPod any user's claim reaches BatchAddClusterNodes through the node's role
                slurm.run("sacctmgr", "-i", "modify", "user", user["name"], "set", "AdminLevel=Admin")
            yield slurm, env, root
    finally:
        remove_accounts()
        shutil.rmtree(root, ignore_errors=True)


def user_environment(slurm: LocalSlurm, base: dict[str, str], user: str, python: str, root: Path) -> dict[str, str]:
    """What a login shell gives ``user`` on a node: the facts, then the profile's own outputs line."""
    home = pwd.getpwnam(user).pw_dir
    script = f"HPL_OUTPUTS_DIR={base['HPL_OUTPUTS_DIR']} HPL_DEFAULT_USER={DEFAULT_USER}\n"
    script += f'{slurm_teams.USER_OUTPUTS_LINE}\necho "$HPL_OUTPUTS_DIR"'
    outputs = subprocess.run(
        ["runuser", "-u", user, "--", "sh", "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    packages = sysconfig.get_paths()["purelib"]
    return slurm.env(
        {
            **base,
            "HOME": home,
            "USER": user,
            "HPL_OUTPUTS_DIR": outputs,
            "PYTHON": python,
            "PYTHONPATH": os.pathsep.join((str(REPO / "payloads"), str(REPO), packages)),
            "HPL_SCALE_WITH_RUNS": "1",
            "HPL_SCALE_GROUP": "compute",
            "HPL_SCALE_FLOOR": "0",
            "HPL_SCALE_CEILING": "2",
            "HPL_SCALER": "tools.local_slurm:SlurmNodeScaler",
            "HPL_SCALER_LOG": str(root / "scaler.jsonl"),
            "HPL_CAPACITY_WAIT_S": "120",
        }
    )


def owners(folder: Path) -> set[int]:
    return {path.stat().st_uid for path in [folder, *folder.rglob("*")]}


def test_two_team_users_run_the_default_chain_at_once_on_the_lifecycles_layout(team_fsx):
    slurm, base, root = team_fsx
    python = user_python()
    envs = {user["name"]: user_environment(slurm, base, user["name"], python, root) for user in USERS}
    assert {env["HPL_OUTPUTS_DIR"] for env in envs.values()} == {
        str(Path(base["HPL_OUTPUTS_DIR"]) / user["name"]) for user in USERS
    }, "each team user's runs go to their own folder"
    config = write_derived(
        DEFAULT_CONFIG, root / "run.toml", {("train", "max_steps"): 2, ("train", "save_steps"): 2},
        run_dir=f"${{HPL_OUTPUTS_DIR}}/{RUN}",
    )  # fmt: skip
    config.chmod(0o644)
    # The download stand-in, as WRITER: the tiny model into the shared models folder (and the records, as an
    # upload of theirs would bring them).
    datasets = Path(base["HPL_DATASETS_DIR"])
    datasets.mkdir()
    os.chown(datasets, USERS[0]["uid"], TEAMS[0]["gid"])
    inputs = "from pathlib import Path; import os; from tools.rehearse import write_inputs; "
    inputs += f"write_inputs(Path({str(config)!r}), dict(os.environ), records=40)"
    for argv in (("-c", inputs), ("-m", "llm_pipeline.download", "--config", str(config))):
        # The stand-in, then the writer's own download step, which finds the model and shares what they wrote.
        wrote = as_user(WRITER, envs[WRITER], python, *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert wrote.wait(timeout=300) == 0, wrote.stdout.read()
    (root / "scaler.jsonl").touch(mode=0o666)  # the scaler stand-in's record of its calls, from either user
    (root / "scaler.jsonl").chmod(0o666)
    nodes = ",".join(slurm.node_names)  # the group at its floor: every node out of service until a claim
    slurm.run("scontrol", "update", f"nodename={nodes}", "state=drain", "reason=floor")

    submits = {
        user: as_user(
            user,
            env,
            python,
            "-m",
            "llm_pipeline.submit",
            "--config",
            str(config),
            "--no-smoke",
            *(["--to", "merge"] if user == READER else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for user, env in envs.items()
    }
    said = {user: proc.communicate(timeout=300) for user, proc in submits.items()}
    for user, proc in submits.items():
        assert proc.returncode == 0, (user, *said[user])
        assert "capacity: claimed 1 node(s) of group compute" in said[user][0], said[user]
    # The reader's chain ends after its merge (--to merge, its claim released after it); the writer's chain
    # generates and evaluates as a team user, the same steps on the same layout
    reader_jobs = SubmittedLine.jobs(said[READER][0])
    assert "merge" in reader_jobs and not {"generate", "evaluate"} & set(reader_jobs), said[READER][0]
    wait_for(lambda: not slurm.run("squeue", "-h").stdout.strip(), 420, "both chains and their release jobs", 2)

    claims = Path(base["HPL_FSX_MOUNT_PATH"]) / slurm_teams.CAPACITY_FOLDER / "compute.json"
    assert json.loads(claims.read_text())["claims"] == {}, "both claims given back"
    scaled = [json.loads(line)["action"] for line in (root / "scaler.jsonl").read_text().splitlines()]
    assert scaled.count("add") == 2, scaled
    for user in USERS:
        run = Path(envs[user["name"]]["HPL_OUTPUTS_DIR"]) / RUN
        states = {p.stem: json.loads(p.read_text())["state"] for p in (run / "logs" / "state").glob("*.json")}
        failed = [log.read_text()[-2000:].replace("\n", " | ") for step, state in states.items() if state != "COMPLETED"
                  for log in (run / "logs").glob(f"{step}-*.log")]  # fmt: skip
        last = "evaluate" if user["name"] == WRITER else "merge"
        assert states and not failed and last in states, (user["name"], states, failed)
        assert not set(states) & set(RUN_STEPS[RUN_STEPS.index(last) + 1 :]), (user["name"], states)
        assert owners(run) == {user["uid"]}, f"{run}: every file is {user['name']}'s"
    model = Path(base["HPL_MODELS_DIR"]) / "tiny-llama"
    assert owners(model) == {USERS[0]["uid"]}, "the writer's download, not rewritten by the other chain"
    (download_log,) = (Path(envs[READER]["HPL_OUTPUTS_DIR"]) / RUN / "logs").glob("download-*.log")
    assert "nothing to download" in download_log.read_text(), "the reader's chain reused the shared model"
    # The reader could also finish a download the writer left half done: the folder is theirs to write.
    finish = subprocess.run(["runuser", "-u", READER, "--", "touch", str(model / "config.json")], capture_output=True)
    assert finish.returncode == 0, finish.stderr
