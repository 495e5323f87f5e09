"""How the Trainium2 acceptance launches its levels, from the deploy's own facts (stdlib only).

Under Pyxis, `srun` runs on the host and only its options put the step in the image, so the acceptance
starts on the host inside ``salloc -N 2`` and every level is an `srun` into the trn2 image
(``level_commands``): the image, mounts and kept variables from slurm/container.sh and the EFA and Neuron
variables from slurm/accelerator_env.sh, the two files every step of a chain uses too:

- node: one task on the first node runs the one-node levels in the image (``trn2_acceptance --on-node``);
- collectives-2-nodes and two-node: one task a node runs jobs/launch.py, the chain's own torchrun launch,
  for the collective probe and for 10 training steps.

Ranks a node are the partition's ``devices_per_node`` in deploy-facts.json (written by the stack from
stacks/accelerators.py: 64 on a trn2.48xlarge): inside the image the one-node levels run
``torchrun --standalone --nnodes=1 --nproc_per_node=<ranks>``; the two-node levels get it from the
partition's HPL_DEVICES_PER_NODE through jobs/launch.py, as a chain's steps do.

Each rank of the rank probe prints one ``RANK_PROBE {json}`` line (host, rank, local rank, device,
NeuronCores it sees); two ranks of one host on the same device and cores FAIL the check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.jobs import deploy_facts, partitions
from llm_pipeline.jobs.launch import PORT_BASE, PORT_SPAN, LaunchError, expand_hostlist

SLURM_DIR = Path(__file__).resolve().parents[2] / "slurm"
PROBE_PREFIX = "RANK_PROBE "
IMAGE_PYTHON = "python3"  # the image's venv is first on its PATH (payloads/Dockerfile.trn2)
# The cluster facts the node profile sets (lifecycle); the levels need them on the host.
BASH_OWN = ("HPL_NODES", "PWD", "OLDPWD", "SHLVL", "_")  # set by the probe or by bash itself, not by the file
CLUSTER_FACTS = ("HPL_FSX_MOUNT_PATH", "HPL_IMAGES_DIR", "HPL_COMPILE_CACHE_DIR")
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


def torchrun(env: Mapping[str, str], payloads_dir: Path, *, python: str = sys.executable) -> list[str]:
    """The command prefix (up to the program) that runs the partition's ranks on this node (in the image)."""
    ranks = ranks_per_node(env, payloads_dir)
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--max_restarts=0",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={ranks}",
    ]


def _bash(script: str, function: str, env: Mapping[str, str]) -> str:
    probe = f'set -euo pipefail; source "$0" >&2; {function}'
    done = subprocess.run(["bash", "-c", probe, str(SLURM_DIR / script)], env=dict(env), capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"payloads/slurm/{script}: {done.stderr.strip()}")
    return done.stdout


def accelerator_environment(env: Mapping[str, str], nodes: int) -> dict[str, str]:
    """The variables slurm/accelerator_env.sh sets for ``nodes`` nodes of the partition whose facts ``env``
    holds: what a chain's steps get, so the acceptance gets the same."""
    after = _bash("accelerator_env.sh", "env -0", {**env, "HPL_NODES": str(nodes)})
    values = dict(item.split("=", 1) for item in after.split("\0") if "=" in item)
    return {name: value for name, value in values.items() if env.get(name) != value and name not in BASH_OWN}


def container_options(env: Mapping[str, str]) -> list[str]:
    """The srun options that run a step in the image (slurm/container.sh, as env.sh gives every step)."""
    return _bash("container.sh", "hpl_container_options", env).splitlines()


@dataclass(frozen=True)
class Level:
    name: str
    argv: list[str]
    env: dict[str, str]  # what the level sets on top of the caller's environment


def level_commands(
    env: Mapping[str, str], payloads_dir: Path, *, report: Path, tiny_config: Path | None, lora_config: Path
) -> list[Level]:
    """Each level's srun argv and environment, from inside a two-node allocation of the trn2 partition."""
    ranks_per_node(env, payloads_dir)  # refuses an allocation outside the deployed partitions
    partition = env["SLURM_JOB_PARTITION"]
    missing = [name for name in CLUSTER_FACTS if not env.get(name)]
    if missing:
        raise LaunchError(f"{', '.join(missing)} not set: run on a cluster node, whose profile sets them")
    have = allocation_nodes(env)
    if have < 2:
        raise LaunchError(
            f"needs a 2-node Slurm allocation (salloc -p {partition} -N 2, run this inside it); it has {have}"
        )
    facts, _ = deploy_facts.read_partitions(payloads_dir)
    base = {
        **partitions.partition_environment(partition, facts[partition]),
        **deploy_facts.read_deploy_facts(payloads_dir, partition=partition),
        "HPL_PAYLOADS_DIR": str(payloads_dir),
        "PYTHONPATH": str(payloads_dir),
    }
    container = container_options({**env, **base, **accelerator_environment({**env, **base}, 2)})
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))[:2]
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    one = {**base, **accelerator_environment({**env, **base}, 1)}
    two = {
        **base,
        **accelerator_environment({**env, **base}, 2),
        "HPL_MASTER_PORT": str(PORT_BASE + (job + 2) % PORT_SPAN),
    }
    node = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={hosts[0]}", *container, IMAGE_PYTHON]
    pair = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}", *container]
    launch = [IMAGE_PYTHON, "-m", "llm_pipeline.jobs.launch", "--exec", "--"]
    on_node = ["-m", "llm_pipeline.trn2_acceptance", "--on-node", "--report-dir", str(report)]
    on_node += [*(["--tiny-config", str(tiny_config)] if tiny_config else []), "--lora-config", str(lora_config)]
    return [
        Level("node", [*node, *on_node], one),
        Level("collectives-2-nodes", [*pair, *launch, "-m", "llm_pipeline.trn2_acceptance", "--rank-probe"], two),
        Level("two-node", [*pair, *launch, "-m", "llm_pipeline.train", "--config", str(report / "two-node.toml")], two),
    ]


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
