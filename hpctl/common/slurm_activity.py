"""What Slurm runs now, asked on the controller over one SSM session: the jobs and their partitions, each
node's state, and Slurm's version. `hpctl scale` and `hpctl update-software` read it before they touch nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field

from cluster_contract import FSX_MOUNT_PATH
from hpctl.common import ssm
from hpctl.common.cluster import ClusterState
from hpctl.common.deployment import Deployment, controller_request
from hpctl.common.errors import HpctlError
from llm_pipeline.jobs.serve_job import JOB_NAME as SERVE_JOB_NAME

# Each answer line carries a tag, so the session's own framing lines are told apart from Slurm's.
JOB_TAG, NODE_TAG, VERSION_TAG, USAGE_TAG = "hpl-job", "hpl-node", "hpl-version", "hpl-usage"
CLAIMS_TAG, SERVE_TAG = "hpl-claims", "hpl-serve-job"
# The usage ledgers of the groups that scale with runs (llm_pipeline.jobs.capacity), where the chains keep them.
LEDGERS = f"{FSX_MOUNT_PATH}/capacity/*.usage.json"
CLAIMS = f"{FSX_MOUNT_PATH}/capacity/*.json"  # the claims files, <group>.json (the ledgers left out by name)
QUERY = (
    'bash -c "'
    f"squeue -h -o '{JOB_TAG} %i %P %T' && "
    f"sinfo -h -N -o '{NODE_TAG} %N %P %T' && "
    f"sinfo -V | sed 's/^/{VERSION_TAG} /'; "
    # the serve jobs (hpctl serve): the job's comment is its run
    f"squeue -h -n {SERVE_JOB_NAME} -o '{SERVE_TAG} %i %P %T %D %k'; "
    f"for f in {LEDGERS}; do test -e $f && echo {USAGE_TAG} $(basename $f .usage.json) $(tr -d ' ' < $f); done; "
    f"for f in {CLAIMS}; do case $f in *.usage.json) ;; *) test -e $f && "
    f"echo {CLAIMS_TAG} $(basename $f .json) \\\"$(tr -d '\\n' < $f)\\\";; esac; done; "
    'true"'
)
# sinfo's node states that mean a job holds (part of) the node
BUSY_STATES = ("allocated", "mixed", "completing")


@dataclass(frozen=True)
class SlurmJob:
    job: str
    partition: str
    state: str  # RUNNING, PENDING, ...


@dataclass(frozen=True)
class ServeJob:
    job: str
    partition: str
    state: str
    nodes: int
    run: str


@dataclass
class SlurmActivity:
    jobs: list[SlurmJob] = field(default_factory=list)
    node_states: dict[str, str] = field(default_factory=dict)  # Slurm node name -> sinfo state
    version: str = ""  # "slurm 24.11.5"
    usage: dict[str, dict] = field(default_factory=dict)  # group -> its usage ledger (scale_with_runs)
    claims: dict[str, dict] = field(default_factory=dict)  # group -> its claims file (scale_with_runs)
    serving: list[ServeJob] = field(default_factory=list)  # the serve jobs (hpctl serve)

    def busy(self, node: str) -> bool:
        return self.node_states.get(node, "").rstrip("*~#!%$@^-+").startswith(BUSY_STATES)

    def jobs_on(self, partitions: tuple[str, ...]) -> list[SlurmJob]:
        """The jobs queued or running on these partitions (a job may name several: "a,b")."""
        return [job for job in self.jobs if set(job.partition.split(",")) & set(partitions)]


def parse(lines: list[str]) -> SlurmActivity:
    activity = SlurmActivity()
    for line in lines:
        words = line.split()
        if len(words) == 4 and words[0] == JOB_TAG:
            activity.jobs.append(SlurmJob(job=words[1], partition=words[2], state=words[3]))
        elif len(words) == 4 and words[0] == NODE_TAG:
            activity.node_states[words[1]] = words[3].lower()
        elif len(words) == 6 and words[0] == SERVE_TAG and words[4].isdigit():
            activity.serving.append(ServeJob(words[1], words[2], words[3], int(words[4]), words[5]))
        elif words[:1] == [VERSION_TAG]:
            activity.version = " ".join(words[1:])
        elif len(words) >= 3 and words[0] == CLAIMS_TAG:
            with contextlib.suppress(ValueError):
                activity.claims[words[1]] = json.loads(line.split(maxsplit=2)[2])
        elif len(words) == 3 and words[0] == USAGE_TAG:
            with contextlib.suppress(ValueError):
                activity.usage[words[1]] = json.loads(words[2])
    return activity


def ask_controller(request: ssm.SessionRequest) -> SlurmActivity:
    """Run the query on the controller; an error naming the session when Slurm did not answer."""
    lines: list[str] = []
    rc = ssm.run_session(dataclasses.replace(request, command=QUERY), lines.append)
    activity = parse(lines)
    if rc != 0 or not activity.version:
        raise HpctlError(
            f"could not ask Slurm on the controller what runs (session exit {rc}): check `hpctl shell`, then "
            "`squeue` and `sinfo` there"
        )
    return activity


def slurm_activity(deployment: Deployment, cluster: ClusterState, controller_group: str) -> SlurmActivity:
    ssm.find_session_tools()
    return ask_controller(controller_request(deployment, cluster, controller_group))
