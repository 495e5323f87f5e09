"""How the Trainium2 acceptance launches its multi-rank checks, from the deploy's own facts (stdlib only).

The submit chain hands its jobs HPL_DEVICES_PER_NODE; a person running the acceptance inside
``salloc -N 2`` has no chain, and the allocation's SLURM_* variables describe two nodes even for the
one-node check. So the acceptance asks for its own shape: ranks a node are the partition's
``devices_per_node`` in deploy-facts.json (written by the stack from stacks/accelerators.py: 64 on a
trn2.48xlarge), nodes are what the check needs (1, or 2 inside a two-node allocation).

- one node: ``torchrun --standalone --nnodes=1 --nproc_per_node=<ranks>`` on this node;
- two nodes: ``srun --nodes=2 --ntasks-per-node=1`` starting one torchrun agent a node, meeting at the
  allocation's first node (c10d), ``--nnodes=2 --nproc_per_node=<ranks>``.

Each rank of the rank probe prints one ``RANK_PROBE {json}`` line (host, rank, local rank, device,
NeuronCores it sees); two ranks of one host on the same device and cores FAIL the check.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from llm_pipeline.jobs import deploy_facts
from llm_pipeline.jobs.launch import PORT_BASE, PORT_SPAN, LaunchError, expand_hostlist

PROBE_PREFIX = "RANK_PROBE "
VISIBLE_CORES = "NEURON_RT_VISIBLE_CORES"  # the Neuron runtime's per-process core set, when set


def ranks_per_node(env: Mapping[str, str], payloads_dir: Path) -> int:
    """The allocation's partition's devices per node, from deploy-facts.json next to the payloads."""
    partitions, _ = deploy_facts.read_partitions(payloads_dir)
    partition = env.get("SLURM_JOB_PARTITION", "")
    if not partitions:
        raise LaunchError(
            f"{Path(payloads_dir) / deploy_facts.DEPLOY_FACTS_FILE} is missing: run this on the cluster, where the "
            "deploy writes it next to the payloads"
        )
    if partition not in partitions:
        raise LaunchError(
            f"SLURM_JOB_PARTITION={partition!r} is not a deployed partition ({', '.join(sorted(partitions))}): "
            "run inside an allocation of the trn2 partition (salloc -p <partition> -N 2)"
        )
    return int(partitions[partition]["devices_per_node"])


def allocation_nodes(env: Mapping[str, str]) -> int:
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "0"
    return int(value) if value.isdigit() else 0


def torchrun(env: Mapping[str, str], payloads_dir: Path, *, nodes: int, python: str = sys.executable) -> list[str]:
    """The command prefix (up to the program) that runs ``nodes`` nodes of the partition's ranks each."""
    ranks = ranks_per_node(env, payloads_dir)
    base = [python, "-m", "torch.distributed.run", "--max_restarts=0"]
    if nodes == 1:
        return [*base, "--standalone", "--nnodes=1", f"--nproc_per_node={ranks}"]
    have = allocation_nodes(env)
    if have < nodes:
        raise LaunchError(
            f"needs a {nodes}-node Slurm allocation (salloc -N {nodes}, run this inside it); it has {have}"
        )
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))[:nodes]
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    port = PORT_BASE + (job + nodes) % PORT_SPAN  # not the chain's port for this job
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}"]
    rendezvous = ["--rdzv_backend=c10d", f"--rdzv_endpoint={hosts[0]}:{port}", f"--rdzv_id={job}-acceptance"]
    return [*srun, *base, f"--nnodes={nodes}", f"--nproc_per_node={ranks}", *rendezvous]


def probe_line(env: Mapping[str, str], host: str, device: str) -> str:
    """This rank's identity line: where torch put it and the cores the Neuron runtime gave it."""
    record = {
        "host": host,
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "device": device,
        "cores": env.get(VISIBLE_CORES, ""),
    }
    return PROBE_PREFIX + json.dumps(record, sort_keys=True)


def read_probes(output: str) -> list[dict]:
    return [json.loads(line[len(PROBE_PREFIX) :]) for line in output.splitlines() if line.startswith(PROBE_PREFIX)]


def duplicates(probes: list[dict]) -> list[str]:
    """One line per device (host, device, cores) that more than one rank reports."""
    seen: dict[tuple[str, str, str], list[int]] = {}
    for probe in probes:
        seen.setdefault((probe["host"], probe["device"], probe["cores"]), []).append(probe["rank"])
    return [
        f"ranks {', '.join(map(str, sorted(ranks)))} share {device} (cores {cores or 'not set'}) on {host}"
        for (host, device, cores), ranks in sorted(seen.items())
        if len(ranks) > 1
    ]
