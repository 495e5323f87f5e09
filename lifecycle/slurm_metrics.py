"""Slurm as Prometheus series, through node exporter's textfile collector (stdlib only, the AMI's Python 3.10).

Two commands, each run every 30 s by a systemd timer that lifecycle/observability.sh installs:
  cluster DIR             on the controller: DIR/slurm.prom with nodes and jobs by state per partition
                          (sinfo, squeue), and hpl_slurm_up 0 when Slurm does not answer
  gpu-jobs DIR GPUS [NODE]  on a GPU node: DCGM exporter's HPC job mapping, one file per GPU index in DIR
                          holding the ids of the Slurm jobs running on this node (our jobs take whole
                          nodes), so every DCGM series carries the job id (label hpc_job)
A file is replaced atomically (rename) and only when its content changes.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

TEXTFILE = "slurm.prom"
ALWAYS_REPORTED = ("pending", "running")  # job states written per partition even when no job is in them
HELP = {
    "hpl_slurm_up": "1 if sinfo and squeue answered at the last collection",
    "hpl_slurm_nodes": "Slurm nodes by partition and state (sinfo %T)",
    "hpl_slurm_jobs": "Slurm jobs by partition and state (squeue %T)",
}


def slurm(*args: str) -> list[list[str]]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=True)
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def cluster_text() -> str:
    nodes: dict[tuple[str, str], int] = collections.Counter()
    jobs: dict[tuple[str, str], int] = collections.Counter()
    try:
        for partition, state, count in slurm("sinfo", "-h", "-o", "%R|%T|%D"):
            nodes[partition.rstrip("*"), state.rstrip("*~#!%$@^-").lower()] += int(count)
        for partition in {partition for partition, _ in nodes}:
            for state in ALWAYS_REPORTED:  # a zero rather than a gap on the dashboard
                jobs[partition, state] += 0
        for partition, state in slurm("squeue", "-h", "-o", "%P|%T"):
            for name in partition.split(","):  # a pending job may name several partitions
                jobs[name, state.lower()] += 1
        up = 1
    except (OSError, subprocess.SubprocessError, ValueError):
        up = 0
    lines = []
    for name, series in (("hpl_slurm_up", {(): up}), ("hpl_slurm_nodes", nodes), ("hpl_slurm_jobs", jobs)):
        lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge"]
        for key, value in sorted(series.items()):
            labels = f'{{partition="{label(key[0])}",state="{label(key[1])}"}}' if key else ""
            lines.append(f"{name}{labels} {value}")
    return "\n".join(lines) + "\n"


def replace_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def gpu_jobs(folder: Path, gpus: int, node: str) -> None:
    try:
        ids = [row[0] for row in slurm("squeue", "-h", "-t", "RUNNING", "-w", node, "-o", "%A")]
    except (OSError, subprocess.SubprocessError):
        ids = []
    for index in range(gpus):
        path = folder / str(index)
        if ids:
            replace_if_changed(path, "\n".join(ids) + "\n")
        elif path.exists():
            path.unlink()


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "cluster":
        folder = Path(argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        replace_if_changed(folder / TEXTFILE, cluster_text())
        return 0
    if len(argv) in (3, 4) and argv[0] == "gpu-jobs" and argv[2].isdigit():
        folder = Path(argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        gpu_jobs(folder, int(argv[2]), argv[3] if len(argv) == 4 else socket.gethostname().split(".")[0])
        return 0
    print("error: usage: slurm_metrics.py cluster DIR | gpu-jobs DIR GPUS [NODE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
