"""The Slurm account and QOS a chain runs under, and who ran a job.

On a cluster with teams (cdk.json `teams`, `users`; lifecycle/slurm_teams.py) each user has one
association: their team's account, with the team's QOS as its default. Submit names both on every
sbatch of the chain (one account for the whole chain, whatever the user's default becomes later) and
says which it used. An account or QOS asked for (submit --account, --qos) wins; Slurm refuses one the
user has no association with. Without accounting (no sacctmgr answer, no association) the chain goes
under Slurm's defaults, as on a cluster without teams. Stdlib only (the controller's python3).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Mapping

ACCOUNT_ENV, QOS_ENV = "HPL_ACCOUNT", "HPL_QOS"  # the submit environment's names, read by sbatch_options

DESCRIPTION_OPENING = "account: "  # describe's line; an offline dry run replaces it (not the cluster's answer)

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def submitting_user() -> str:
    """The user sbatch submits as: this process's real uid (not $USER, which sudo or runuser may keep)."""
    return pwd.getpwuid(os.getuid()).pw_name


def _rows(run: Runner, argv: list[str]) -> list[list[str]]:
    done = run(argv)
    if done.returncode != 0:
        return []
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


def association(user: str, run: Runner, *, account: str = "") -> tuple[str, str]:
    """(account, default QOS) of ``user``'s association in slurmdbd: under ``account``, else under their
    default account; ("", "") when slurmdbd knows none (no accounting here)."""
    if not account:
        found = _rows(run, ["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"])
        account = found[0][0].strip() if found else ""
        if not account:
            return "", ""
    where = [f"user={user}", f"account={account}"]
    rows = _rows(run, ["sacctmgr", "-n", "-P", "show", "assoc", "where", *where, "format=DefaultQOS"])
    return account, rows[0][0].strip() if rows else ""


def account_environment(run: Runner, *, account: str = "", qos: str = "") -> dict[str, str]:
    """HPL_ACCOUNT and HPL_QOS for the chain: the ones asked for, else the submitting user's association."""
    found_account, default_qos = association(submitting_user(), run, account=account)
    chosen = {ACCOUNT_ENV: account or found_account, QOS_ENV: qos or default_qos}
    return {name: value for name, value in chosen.items() if value}


def describe(env: Mapping[str, str]) -> str:
    """One line: what the chain runs under."""
    account, qos = env.get(ACCOUNT_ENV), env.get(QOS_ENV)
    if not account and not qos:
        user = submitting_user()
        return f"{DESCRIPTION_OPENING}Slurm's default for {user} (no association found in Slurm accounting)"
    return f"{DESCRIPTION_OPENING}{account or 'the default'}, QOS: {qos or 'the default'} (user {submitting_user()})"


def sbatch_options(env: Mapping[str, str]) -> list[str]:
    options = [("--account", env.get(ACCOUNT_ENV)), ("--qos", env.get(QOS_ENV))]
    return [f"{option}={value}" for option, value in options if value]


def job_owner(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Who ran this job and under which account and QOS (Slurm sets these in every job's environment)."""
    env = os.environ if env is None else env
    return {
        "user": env.get("SLURM_JOB_USER") or submitting_user(),
        "account": env.get("SLURM_JOB_ACCOUNT", ""),
        "qos": env.get("SLURM_JOB_QOS", ""),
    }
