"""torchrun for the current Slurm step: its arguments, or torchrun itself (read by payloads/slurm/env.sh).

Every node runs one torchrun agent with the same arguments; they meet through a c10d rendezvous
on the step's first node, so the same command works on 1 node or many:

    --nnodes=<nodes of the step> --nproc_per_node=<devices per node>
    --rdzv_backend=c10d --rdzv_endpoint=<first node's address>:<port> --rdzv_id=<job id>

    python -m llm_pipeline.jobs.launch                       print the arguments, one per line
    python -m llm_pipeline.jobs.launch --exec [--wrap CMD] -- -m MODULE [ARGS]
                                                            exec [CMD] <this python> -m torch.distributed.run
                                                            <arguments> -m MODULE [ARGS]

env.sh runs the --exec form as the srun'd command, so the arguments are computed from the step's own
node list each time the step starts: when HyperPod's auto-resume (srun --auto-resume=1) replaces a
node and starts the step again, the rendezvous moves to the new first node. Runs on the host's or the
training image's Python (stdlib only, Python 3.10); Slurm host lists are expanded here, so it needs
no Slurm commands inside a container.
Settings: HPL_DEVICES_PER_NODE (processes per node: the partition's devices, from the accelerator
table through submit (llm_pipeline.jobs.partitions): 32 NeuronCores on a trn1.32xlarge, 8 GPUs on a
p5.48xlarge, 1 on a CPU node or when unset), HPL_MASTER_PORT (default: derived from the job id, so
jobs sharing a node do not collide).

Inside a SageMaker training job (SM_HOSTS set) the hosts come from the job instead of Slurm: one
host runs torchrun --standalone; several meet at the first host (algo-1) on SM_MASTER_PORT, each
with its rank in the sorted host list, as the SageMaker SDK's own torchrun driver does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping

from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import sagemaker_env

# Below Linux's ephemeral range (32768-60999), where a job's outgoing connections could already hold the port.
PORT_BASE, PORT_SPAN = 20000, 12000


class LaunchError(PipelineError, ValueError):
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


_RANGE = re.compile(r"\[([^\[\]]*)\]")


def _split_top_level(expression: str) -> list[str]:
    """Split a host list on the commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for char in expression:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise LaunchError(f"host list {expression!r} has unbalanced brackets")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise LaunchError(f"host list {expression!r} has unbalanced brackets")
    return [*parts, current]


def _expand_name(name: str, expression: str) -> list[str]:
    match = _RANGE.search(name)
    if match is None:
        return [name]
    head, tail, numbers = name[: match.start()], name[match.end() :], []
    for item in match.group(1).split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise LaunchError(f"host list {expression!r}: {item!r} is not a number or a rising range")
        # Slurm keeps the zero padding of the range's first number: n[01-10] -> n01 ... n10.
        numbers.extend(f"{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1))
    return [host for number in numbers for host in _expand_name(head + number + tail, expression)]


def expand_hostlist(expression: str) -> list[str]:
    """Expand a Slurm host list ("ip-10-1-7-[20,22],ip-10-1-9-[3-4]") the way `scontrol show hostnames` does."""
    hosts = [host for part in _split_top_level(expression) if part for host in _expand_name(part, expression)]
    if not hosts:
        raise LaunchError(f"host list {expression!r} names no hosts")
    return hosts


def scontrol_node_address(node: str) -> str:
    """The address Slurm reaches `node` at (NodeAddr); the name itself when Slurm cannot say (no scontrol
    inside a container: HyperPod node names resolve to their addresses)."""
    if shutil.which("scontrol") is None:
        return node
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True)
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def torchrun_args(
    env: Mapping[str, str],
    *,
    hostnames: Callable[[str], list[str]] = expand_hostlist,
    node_address: Callable[[str], str] = scontrol_node_address,
) -> list[str]:
    """Arguments for the nodes of this Slurm step (SLURM_STEP_*), else of the whole allocation (SLURM_JOB_*)."""
    scope = "STEP" if env.get("SLURM_STEP_NODELIST") else "JOB"
    nodes = _int_var(env, f"SLURM_{scope}_NUM_NODES")
    job_id = _int_var(env, "SLURM_JOB_ID")
    nodelist = env.get(f"SLURM_{scope}_NODELIST", "")
    if not nodelist:
        raise LaunchError(f"SLURM_{scope}_NODELIST is not set: run inside a Slurm job (sbatch/srun)")
    hosts = hostnames(nodelist)
    if len(hosts) != nodes:
        raise LaunchError(
            f"SLURM_{scope}_NODELIST={nodelist} names {len(hosts)} hosts but SLURM_{scope}_NUM_NODES={nodes}"
        )
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
    job = sagemaker_env.read_hosts(env)
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


def torchrun_command(env: Mapping[str, str], program: list[str], wrap: str | None = None) -> list[str]:
    """[wrap] <this python> -m torch.distributed.run <launch arguments> <program>."""
    return [*([wrap] if wrap else []), sys.executable, "-m", "torch.distributed.run", *launch_args(env), *program]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        if not argv:
            print("\n".join(launch_args(os.environ)))
            return 0
        wrap = None
        if argv[:1] == ["--exec"] and argv[1:2] == ["--wrap"] and len(argv) > 2:
            wrap, argv = argv[2], ["--exec", *argv[3:]]
        if argv[:2] != ["--exec", "--"] or len(argv) < 3:
            raise LaunchError("usage: python -m llm_pipeline.jobs.launch [--exec [--wrap CMD] -- PROGRAM ARGS...]")
        command = torchrun_command(os.environ, argv[2:], wrap)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    node = os.environ.get("SLURMD_NODENAME", "?")
    print(f"+ [{node}] {' '.join(command)}", file=sys.stderr, flush=True)
    os.execvp(command[0], command)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main())
