"""Two teams on one local Slurm with accounting in a real database (MariaDB + slurmdbd).

The cluster, the Linux users, their folders and Slurm's accounts, QOS and associations are made by
the code the controller's lifecycle runs (lifecycle/slurm_teams.py); the users file is the one the stack
generates from a cdk.json `users`/`teams` config (stacks/teams.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from slurm_helpers import REPO, wait_for

from hpctl.teams import usage
from lifecycle import slurm_teams
from stacks.teams import users_file
from tools.local_slurm import LocalSlurm, missing_binaries

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-teams")]

# uids and gids no Debian system account uses; the test removes the users it made.
CONTEXT = {
    "teams": [
        {"name": "research", "gid": 46100, "fairshare": 3},
        {"name": "product", "gid": 46200, "fairshare": 1, "max_nodes": 1},
    ],
    "users": [
        {"name": "hplalice", "uid": 46101, "team": "research"},
        {"name": "hplbob", "uid": 46201, "team": "product"},
    ],
}
ALICE, BOB = "hplalice", "hplbob"
CLUSTER_GROUP = {"name": "hplteamsall", "gid": 46150}  # instead of the lifecycle's default: the test's id range


def remove_users(spec: dict) -> None:
    for user in spec["users"]:
        subprocess.run(["userdel", user["name"]], capture_output=True)
    for team in [*spec["teams"], CLUSTER_GROUP]:
        subprocess.run(["groupdel", team["name"]], capture_output=True)


@pytest.fixture(scope="module")
def team_cluster():
    if os.geteuid() != 0:
        pytest.fail("test_teams creates Linux users and runs a local Slurm: run it as root", pytrace=False)
    missing = missing_binaries(accounting=True)
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run tools/system_packages.sh (as root)", pytrace=False)
    spec = {**users_file(CONTEXT["teams"], CONTEXT["users"]), "cluster_group": CLUSTER_GROUP}
    # Short and world-searchable: the users' jobs read slurm.conf and write under it.
    root = Path(tempfile.mkdtemp(prefix="hpl-teams-"))
    root.chmod(0o755)
    remove_users(spec)
    try:
        slurm_teams.ensure_users(spec, root / slurm_teams.HOMES_FOLDER)
        slurm_teams.ensure_layout(spec, (0, 0), root, root / "outputs", [])  # the users' homes and outputs
        with LocalSlurm(root / "slurm", nodes=2, cpus_per_node=2, teams=spec) as slurm:
            yield slurm, spec, root
    finally:
        remove_users(spec)
        shutil.rmtree(root, ignore_errors=True)


def as_user(slurm: LocalSlurm, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], env=slurm.env(), capture_output=True, text=True)


def sbatch(slurm: LocalSlurm, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    home = pwd.getpwnam(user).pw_dir
    return as_user(slurm, user, "sbatch", "--parsable", f"--chdir={home}", "--output=/dev/null", *args)


def test_fair_share_follows_the_teams_weights(team_cluster):
    slurm, _, _ = team_cluster
    shares = slurm.run("sshare", "-n", "-P", "-o", "Account,User,RawShares,NormShares").stdout
    rows = [[field.strip() for field in line.split("|")] for line in shares.splitlines()]
    accounts = {fields[0]: fields for fields in rows if not fields[1]}
    assert accounts["research"][2] == "3" and accounts["product"][2] == "1", shares
    assert float(accounts["research"][3]) == pytest.approx(3 * float(accounts["product"][3])), shares


def test_a_job_over_the_teams_qos_is_refused_in_one_line(team_cluster):
    slurm, _, _ = team_cluster
    refused = sbatch(slurm, BOB, "-N", "2", "--wrap", "true")
    assert refused.returncode != 0 and not refused.stdout.strip(), "refused at submit: no job id"
    first = refused.stderr.strip().splitlines()[0]
    assert first == "sbatch: error: QOSMaxNodePerJobLimit", refused.stderr  # the limit, named in its own line
    allowed = sbatch(slurm, ALICE, "-N", "2", "--wrap", "true")  # research has no node limit
    assert allowed.returncode == 0, allowed.stderr


def test_an_unknown_user_cannot_run(team_cluster):
    slurm, _, _ = team_cluster
    refused = as_user(slurm, "nobody", "sbatch", "--chdir=/tmp", "--output=/dev/null", "--wrap", "true")
    assert refused.returncode != 0 and "account" in refused.stderr.lower(), refused.stderr


def test_sacct_and_hpctl_usage_attribute_each_job_to_its_user_and_team(team_cluster):
    slurm, _, _ = team_cluster
    ids = {user: sbatch(slurm, user, "-N", "1", "--wrap", "sleep 2").stdout.strip() for user in (ALICE, BOB)}
    assert all(ids.values()), ids

    def finished() -> bool:
        states = slurm.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", ",".join(ids.values())).stdout.split()
        return len(states) == 2 and all(state == "COMPLETED" for state in states)

    wait_for(finished, 60, "both jobs to complete")
    rows = slurm.run("sacct", "-a", "-n", "-X", "-P", "-o", "JobID,User,Account,ElapsedRaw,NNodes").stdout
    by_id = {line.split("|")[0]: line.split("|") for line in rows.splitlines()}
    assert by_id[ids[ALICE]][1:3] == [ALICE, "research"], rows
    assert by_id[ids[BOB]][1:3] == [BOB, "product"], rows
    node_seconds = {"research": 0.0, "product": 0.0}
    for _, _, account, elapsed, nodes in by_id.values():
        node_seconds[account] += int(elapsed) * int(nodes)

    report = subprocess.run(
        [sys.executable, "-m", "hpctl", "usage", "--local", "--since", "2000-01-01", "--json"],
        env=slurm.env(),
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    teams = usage.read_json(report.stdout)["teams"]
    for team, seconds in node_seconds.items():
        assert abs(teams[team]["node_hours"] * 3600 - seconds) < 1, (team, teams, seconds)


def test_a_user_cannot_write_into_another_users_outputs(team_cluster):
    _, _, root = team_cluster
    theirs = root / "outputs" / ALICE
    refused = subprocess.run(["runuser", "-u", BOB, "--", "touch", str(theirs / "x")], capture_output=True, text=True)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    own = subprocess.run(["runuser", "-u", ALICE, "--", "touch", str(theirs / "x")], capture_output=True, text=True)
    assert own.returncode == 0, own.stderr
    assert (theirs / "x").stat().st_gid == 46100, "setgid: files stay in the team's group"


def submitted_ids(stdout: str) -> list[str]:
    return [line.split()[-1] for line in stdout.splitlines() if line.startswith("submitted ")]


def chain_as(slurm: LocalSlurm, user: str, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """python3 -m llm_pipeline.submit as ``user`` (the system python3: the user cannot read this venv), for a
    run config in their outputs folder; the chain from merge: three jobs, no training."""
    folder = root / "outputs" / user
    config = folder / "chain.toml"
    config.write_text(f'[paths]\noutput_dir = "{folder / "run"}"\n')
    entry = pwd.getpwnam(user)
    os.chown(config, entry.pw_uid, entry.pw_gid)
    argv = ["/usr/bin/python3", "-m", "llm_pipeline.submit", "--config", str(config), "--from", "merge", *args]
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], env=slurm.env(), cwd=REPO / "payloads", capture_output=True, text=True
    )


def test_a_users_chain_runs_under_their_teams_account_and_says_so(team_cluster):
    slurm, _, root = team_cluster
    done = chain_as(slurm, ALICE, root)
    ids = submitted_ids(done.stdout)
    slurm.run("scancel", *ids, check=False)  # the accounting record is what counts here, not the steps
    assert done.returncode == 0 and len(ids) == 3, done.stdout + done.stderr
    assert f"account: research, QOS: research-qos (user {ALICE})" in done.stdout.splitlines()
    expected = sorted(f"{job}|{ALICE}|research|research-qos" for job in ids)

    def recorded() -> list[str]:  # slurmctld sends the records to slurmdbd a moment later
        return sorted(
            slurm.run("sacct", "-n", "-X", "-P", "-o", "JobID,User,Account,QOS", "-j", ",".join(ids)).stdout.split()
        )

    wait_for(lambda: recorded() == expected, 30, f"sacct to show {expected} (it shows {recorded()})")

    dry = chain_as(slurm, BOB, root, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    sbatch_lines = [line for line in dry.stdout.splitlines() if "sbatch " in line]
    assert len(sbatch_lines) == 3 and all("--account=product --qos=product-qos" in line for line in sbatch_lines)
    assert "# account: product, QOS: product-qos" in dry.stderr

    # Another team's account is refused by Slurm, in one line, before any job of the chain is queued.
    refused = chain_as(slurm, BOB, root, "--account", "research")
    assert refused.returncode == 2 and not submitted_ids(refused.stdout), refused.stdout
    assert refused.stderr.count("\n") == 1 and "Invalid account" in refused.stderr, refused.stderr


def fair_share_rows(slurm: LocalSlurm) -> dict[str, tuple[float, float]]:
    """Each team account's (raw usage, fair-share factor) from sshare."""
    out = slurm.run("sshare", "-n", "-P", "-o", "Account,User,RawUsage,FairShare", "-a").stdout
    rows = [[field.strip() for field in line.split("|")] for line in out.splitlines()]
    users = {fields[1]: fields for fields in rows if fields[1] in (ALICE, BOB)}
    return {users[name][0]: (float(users[name][2]), float(users[name][3])) for name in users}


def test_fair_share_puts_the_heavier_weighted_team_first_after_usage(team_cluster):
    """research (weight 3) uses about 1.5 times what product (weight 1) uses; with 3:1 shares research is still
    under its share and product over it, so research's waiting job comes first (1:1 shares would reverse it)."""
    slurm, _, _ = team_cluster
    used = {ALICE: sbatch(slurm, ALICE, "-n", "2", "--wrap", "sleep 3"), BOB: sbatch(slurm, BOB, "--wrap", "sleep 4")}
    wait_for(lambda: not slurm.run("squeue", "-h").stdout.strip(), 60, "the usage jobs to finish")
    slurm.restart_controller()  # recompute the fair-share factors now (otherwise every PriorityCalcPeriod)
    usage_and_factor = fair_share_rows(slurm)
    research, product = usage_and_factor["research"], usage_and_factor["product"]
    assert product[0] < research[0] < 3 * product[0], (used, usage_and_factor)  # more usage, not 3x more
    assert research[1] > product[1], usage_and_factor

    slurm.run("sbatch", "--parsable", "-N", "2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 60")
    wait_for(lambda: "R" in slurm.run("squeue", "-h", "-o", "%t").stdout.split(), 30, "the blocking job to run")
    waiting = [sbatch(slurm, user, "--wrap", "true").stdout.strip() for user in (BOB, ALICE)]  # bob's is older
    queue = slurm.run("squeue", "-h", "-t", "PD", "--sort=-p", "-o", "%i|%u|%a|%Q").stdout.split()
    slurm.run("scancel", "--partition", "local", check=False)
    ordered = [line.split("|") for line in queue]
    assert [row[0] for row in ordered] == [waiting[1], waiting[0]], queue
    assert [row[1:3] for row in ordered] == [[ALICE, "research"], [BOB, "product"]], queue
    assert int(ordered[0][3]) > int(ordered[1][3]), queue
