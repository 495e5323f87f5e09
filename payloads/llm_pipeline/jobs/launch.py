"""torchrun arguments for the current Slurm allocation, one per line (read by payloads/slurm/env.sh).

Every node runs one torchrun agent with the same arguments; they meet through a c10d rendezvous
on the allocation's first node, so the same command works on 1 node or many:

    --nnodes=<SLURM_JOB_NUM_NODES> --nproc_per_node=<devices per node>
    --rdzv_backend=c10d --rdzv_endpoint=<first node's address>:<port> --rdzv_id=<job id>

Runs on the host Python of a compute node (stdlib only, Python 3.10).
Settings: HPL_DEVICES_PER_NODE (processes per node: 32 NeuronCores on a trn1.32xlarge; 1 when
unset), HPL_MASTER_PORT (default: derived from the job id, so jobs sharing a node do not collide).

Inside a SageMaker training job (SM_HOSTS set) the hosts come from the job instead of Slurm: one
host runs torchrun --standalone; several meet at the first host (algo-1) on SM_MASTER_PORT, each
with its rank in the sorted host list, as the SageMaker SDK's own torchrun driver does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping

from llm_pipeline.jobs import sagemaker_env

PORT_BASE, PORT_SPAN = 20000, 20000


class LaunchError(ValueError):
    """The Slurm environment cannot describe a launch; the message names the variable."""


def _int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name, "")
    if not value:
        if default is None:
            raise LaunchError(f"{name} is not set: run inside a Slurm job (sbatch/srun)")
        return default
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer") from None
    if number < 1:
        raise LaunchError(f"{name}={value!r} must be at least 1")
    return number


def scontrol_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm host list ("ip-10-1-[2-5]") into names, the way Slurm itself does."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    if out.returncode != 0:
        raise LaunchError(f"scontrol show hostnames {nodelist} failed: {out.stderr.strip()}")
    return out.stdout.split()


def scontrol_node_address(node: str) -> str:
    """The address Slurm reaches `node` at (NodeAddr); the name itself when Slurm cannot say."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True)
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def torchrun_args(
    env: Mapping[str, str],
    *,
    hostnames: Callable[[str], list[str]] = scontrol_hostnames,
    node_address: Callable[[str], str] = scontrol_node_address,
) -> list[str]:
    nodes = _int_var(env, "SLURM_JOB_NUM_NODES")
    job_id = _int_var(env, "SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        raise LaunchError("SLURM_JOB_NODELIST is not set: run inside a Slurm job (sbatch/srun)")
    hosts = hostnames(nodelist)
    if len(hosts) != nodes:
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist} names {len(hosts)} hosts but SLURM_JOB_NUM_NODES={nodes}")
    port = _int_var(env, "HPL_MASTER_PORT", PORT_BASE + job_id % PORT_SPAN)
    nproc = _int_var(env, "HPL_DEVICES_PER_NODE", 1)
    return [
        f"--nnodes={nodes}",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={node_address(hosts[0])}:{port}",
        f"--rdzv_id={job_id}",
        # A failed worker fails the step; restarts belong to Slurm (HyperPod auto-resume).
        "--max_restarts=0",
    ]


def sagemaker_torchrun_args(env: Mapping[str, str]) -> list[str]:
    """torchrun arguments for this host of a SageMaker training job (SM_HOSTS / resourceconfig.json)."""
    try:
        job = sagemaker_env.read_hosts(env)
    except sagemaker_env.SageMakerEnvError as exc:
        raise LaunchError(str(exc)) from None
    nproc = sagemaker_env.devices_per_node(env)
    if len(job.hosts) == 1:
        # A free local port: jobs rehearsed side by side on one machine never collide.
        return ["--standalone", "--nnodes=1", f"--nproc_per_node={nproc}", "--max_restarts=0"]
    return [
        f"--nnodes={len(job.hosts)}",
        f"--nproc_per_node={nproc}",
        f"--node_rank={job.rank}",
        f"--master_addr={job.leader}",
        f"--master_port={job.master_port}",
        "--max_restarts=0",  # SageMaker restarts the whole job (managed spot), not single workers
    ]


def launch_args(env: Mapping[str, str]) -> list[str]:
    """The torchrun arguments for where this runs: a SageMaker training job, else a Slurm allocation."""
    if sagemaker_env.in_training_job(env):
        return sagemaker_torchrun_args(env)
    return torchrun_args(env)


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        print("\n".join(launch_args(os.environ)))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
