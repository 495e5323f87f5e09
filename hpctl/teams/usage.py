"""`hpctl usage`: node-hours, device-hours and cost per user and team, from Slurm's accounting (sacct).

A team is a Slurm account (lifecycle/slurm_teams.py makes one per cdk.json team), so each job's
account names its team. Node-hours are each job's elapsed time times its nodes; device-hours are its
GPUs or Neuron devices (the gres in its allocation, else the partition's devices per node from the
cluster facts) times the elapsed time; cost is node-hours at the on-demand price of the partition's
instance type, the price the estimate uses (hpctl/run_progress.py: the Price List API).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpctl.common.errors import HpctlError

FIELDS = ("JobID", "User", "Account", "Partition", "ElapsedRaw", "NNodes", "AllocTRES")
GRES = re.compile(r"gres/(?:gpu|neuron\w*)=(\d+)")


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    account: str
    partition: str
    seconds: int
    nodes: int
    devices: int  # from the allocation's gres; 0 when Slurm tracks none


def sacct_argv(since: str) -> list[str]:
    """Every user's jobs (-a), allocations only (-X: steps would count twice), since a date sacct reads."""
    return ["sacct", "-a", "-X", "-n", "-P", "-S", since, "-E", "now", "-o", ",".join(FIELDS)]


def parse(text: str) -> list[Job]:
    """sacct -P lines; other lines (a session's banner) are skipped."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != len(FIELDS) or not parts[4].isdigit() or not parts[5].isdigit():
            continue
        devices = sum(int(count) for count in GRES.findall(parts[6]))
        jobs.append(Job(parts[0], parts[1], parts[2], parts[3], int(parts[4]), int(parts[5]), devices))
    return jobs


def summarize(
    jobs: list[Job],
    *,
    partitions: Mapping[str, Mapping] | None = None,
    price_of: Callable[[str], float | None] = lambda _type: None,
) -> dict:
    """Totals per user and per team (account). ``partitions``: the cluster facts' partitions (instance
    type, devices per node); ``price_of``: an instance type's on-demand USD per hour, or None."""
    partitions = partitions or {}
    totals: dict[str, dict[str, dict]] = {"users": {}, "teams": {}}
    for job in jobs:
        facts = partitions.get(job.partition, {})
        instance_type = facts.get("instance_type", "")
        hours = job.seconds / 3600 * job.nodes
        devices = job.devices or job.nodes * int(facts.get("devices_per_node", 0))
        price = price_of(instance_type) if instance_type else None
        for kind, name in (("users", job.user), ("teams", job.account)):
            row = totals[kind].setdefault(
                name, {"jobs": 0, "node_hours": 0.0, "device_hours": 0.0, "cost_usd": 0.0, "unpriced_node_hours": 0.0}
            )
            row["jobs"] += 1
            row["node_hours"] += hours
            row["device_hours"] += devices * job.seconds / 3600
            if price is None:
                row["unpriced_node_hours"] += hours
            else:
                row["cost_usd"] += hours * price
    return totals


def render_text(totals: dict, since: str) -> str:
    lines = [f"usage since {since} (sacct; cost at on-demand prices)"]
    for kind, title in (("teams", "team (account)"), ("users", "user")):
        lines.append(f"{title:<20} {'jobs':>5} {'node-h':>10} {'device-h':>10} {'cost':>12}")
        for name, row in sorted(totals[kind].items()):
            cost = f"${row['cost_usd']:,.2f}"
            if row["unpriced_node_hours"]:
                cost += f" (+{row['unpriced_node_hours']:.3f} node-h unpriced)"
            lines.append(
                f"{name:<20} {row['jobs']:>5} {row['node_hours']:>10.3f} {row['device_hours']:>10.3f} {cost:>12}"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def read_json(text: str) -> dict:
    return json.loads(text)


def local_sacct(since: str) -> str:
    """sacct on this machine: on the controller, or against the rehearsal's local Slurm (SLURM_CONF)."""
    try:
        done = subprocess.run(sacct_argv(since), capture_output=True, text=True)
    except FileNotFoundError:
        raise HpctlError("--local needs sacct on this machine (the controller, or the local Slurm)") from None
    if done.returncode != 0:
        raise HpctlError(f"sacct failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout
