"""Slurm as Prometheus series, through node exporter's textfile collector (stdlib only, the AMI's Python 3.10).

Commands, run by systemd timers or Slurm's epilog that lifecycle/observability.sh installs:
  cluster DIR             on the controller, every 30 s: DIR/slurm.prom with nodes and jobs by state per
                          partition (sinfo, squeue), and hpl_slurm_up 0 when Slurm does not answer
  gpu-jobs DIR GPUS [NODE [AMI_MAPPING]]  on a GPU node, every 30 s: DCGM exporter's HPC job mapping, one file per
                          GPU index in DIR holding the ids of the Slurm jobs on that GPU, so every DCGM series carries
                          its job id (label hpc_job): a copy of the AMI's own mapping (/run/slurm/dcgm-job-mapping,
                          its prolog and epilog keep it) where that exists, else from Slurm's allocation (each job's
                          GPU indexes on this node; a job holding none by index gets the GPUs no job holds)
  run-ended DIR           Slurm's epilog on a compute node: the ended job's run metrics (DIR/hpl_run_<job>.prom,
                          written by llm_pipeline.jobs.prom_textfile) leave node exporter, so its series end
  sweep DIR [NODE]        on a compute node, every 15 s: the run metrics of jobs no longer on this node (the
                          epilog did not run: a killed slurmd, a node without our epilog) are removed, and
                          DIR/hpl_jobs.prom says, per Slurm job on this node, when the sweep last saw it there (the
                          dashboard hides a run no node has vouched for in a minute, and finds a job's nodes)
  exporter-state DIR NAME [REASON]  DIR/hpl_exporter_NAME.prom: hpl_exporter_failed{exporter,reason} 1 when the
                          lifecycle could not start exporter NAME (hpctl status reports it); no REASON: removed
  efa DIR [SYSFS]         on a compute node with EFA, every 30 s: DIR/efa.prom with every EFA port counter the
                          driver keeps (SYSFS, default /sys/class/infiniband: <device>/ports/<port>/hw_counters/<name>)
                          as hpl_efa_<name>_total{device,port}; node exporter's infiniband collector does not read them
  slurm-source SLURM_CONF VERSION  prints where the controller's Slurm series come from: "openmetrics PORT" where
                          Slurm is 25.11 or newer and slurm.conf turns its OpenMetrics endpoints on
                          (MetricsType=metrics/openmetrics, no PrivateData), else "poll <why>" (the cluster command)
  epilog-script DIR PYTHON SCRIPT  prints the epilog the lifecycle installs (PYTHON SCRIPT run-ended DIR)
A file is replaced atomically (rename) and only when its content changes.
"""

from __future__ import annotations

import collections
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXTFILE = "slurm.prom"
RUN_TEXTFILE_PREFIX = "hpl_run_"  # + <Slurm job id>.prom: llm_pipeline.jobs.prom_textfile.run_textfile_name
HEARTBEAT_TEXTFILE = "hpl_jobs.prom"
HEARTBEAT = "hpl_job_heartbeat_timestamp_seconds"
EXPORTER_FAILED = "hpl_exporter_failed"  # hpctl/observe/observability.py reads it
AMI_GPU_JOB_MAPPING = Path("/run/slurm/dcgm-job-mapping")  # kept by the HyperPod AMI's prolog and epilog
GPU_INDEXES = re.compile(r"GRES=[^ ]*?gpu[^ (]*\(IDX:(?P<indexes>[0-9,-]+)\)")
OPENMETRICS_SINCE = (25, 11)  # slurmctld serves /metrics/* from this release (SchedMD's metrics guide)
OPENMETRICS_TYPE = "metrics/openmetrics"
SLURMCTLD_PORT = "6817"  # Slurm's default SlurmctldPort
EFA_TEXTFILE = "efa.prom"
EFA_SYSFS = "/sys/class/infiniband"
EFA_SERIES = "hpl_efa_{counter}_total"  # one series per counter file, named after the driver's own counter name
EFA_COUNTER_NAME = re.compile(r"[a-z][a-z0-9_]*")
EFA_NOT_COUNTERS = {"lifespan"}  # hw_counters/lifespan: how long the kernel caches the values (ms), not a counter
ALWAYS_REPORTED = ("pending", "running")  # job states written per partition even when no job is in them
HELP = {
    "hpl_slurm_up": "1 if sinfo and squeue answered at the last collection",
    "hpl_slurm_nodes": "Slurm nodes by partition and state (sinfo %T)",
    "hpl_slurm_jobs": "Slurm jobs by partition and state (squeue %T)",
    HEARTBEAT: "when this node's sweep last saw the Slurm job on this node",
    EXPORTER_FAILED: "1 when the node's lifecycle could not start this exporter, with the reason",
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


def index_list(text: str) -> list[int]:
    """Slurm's GPU index list ("0-1,3") as indexes."""
    indexes = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        indexes += range(int(first), int(last or first) + 1)
    return indexes


def allocated_gpus(job_id: str, node: str) -> list[int] | None:
    """The GPU indexes Slurm gave ``job_id`` on ``node`` (scontrol -d: "Nodes=... GRES=gpu:2(IDX:0-1)"); None when
    the job holds no GPU by index there (it asked for none: our jobs take whole nodes)."""
    for words in slurm("scontrol", "-d", "-o", "show", "job", job_id):
        for detail in " ".join(words).split(" Nodes=")[1:]:
            nodes = detail.split()[0]
            gres = GPU_INDEXES.search(detail)
            if gres and node in {row[0] for row in slurm("scontrol", "show", "hostnames", nodes)}:
                return index_list(gres["indexes"])
    return None


def slurm_gpu_jobs(gpus: int, node: str) -> dict[int, list[str]]:
    """GPU index -> the running jobs Slurm gave it on ``node``; a job without GPU indexes gets the GPUs no job holds."""
    holders: dict[int, list[str]] = {index: [] for index in range(gpus)}
    whole_node = []
    for job_id in [row[0] for row in slurm("squeue", "-h", "-t", "RUNNING", "-w", node, "-o", "%A")]:
        indexes = allocated_gpus(job_id, node)
        if indexes is None:
            whole_node.append(job_id)
        for index in indexes or []:
            holders.setdefault(index, []).append(job_id)
    for jobs in holders.values():
        if not jobs:
            jobs += whole_node
    return holders


def ami_gpu_jobs(mapping: Path) -> dict[int, list[str]]:
    """The AMI's own mapping: one file per GPU index holding the ids of the jobs on it."""
    return {
        int(path.name): path.read_text().split() for path in mapping.iterdir() if path.name.isdigit() and path.is_file()
    }


def gpu_jobs(folder: Path, gpus: int, node: str, ami_mapping: Path = AMI_GPU_JOB_MAPPING) -> str:
    """DCGM exporter's job mapping in ``folder``: the AMI's where it keeps one, else Slurm's allocation; says which."""
    if ami_mapping.is_dir():
        holders, source = ami_gpu_jobs(ami_mapping), str(ami_mapping)
    else:
        try:
            holders, source = slurm_gpu_jobs(gpus, node), "slurm"
        except (OSError, subprocess.SubprocessError, ValueError):
            holders, source = {}, "none (Slurm did not answer)"
    for path in folder.iterdir():
        if path.name.isdigit() and not holders.get(int(path.name)):
            path.unlink()
    for index, jobs in holders.items():
        if jobs:
            replace_if_changed(folder / str(index), "\n".join(jobs) + "\n")
    return source


def run_textfiles(folder: Path) -> dict[str, Path]:
    """The run metrics files in ``folder`` by Slurm job id."""
    return {
        path.name[len(RUN_TEXTFILE_PREFIX) : -len(".prom")]: path
        for path in folder.glob(f"{RUN_TEXTFILE_PREFIX}*.prom")
    }


def run_ended(folder: Path, job_id: str) -> None:
    path = run_textfiles(folder).get(job_id)
    if path is not None:
        path.unlink(missing_ok=True)


def heartbeat_text(job_ids: list[str], now: float) -> str:
    lines = [f"# HELP {HEARTBEAT} {HELP[HEARTBEAT]}", f"# TYPE {HEARTBEAT} gauge"]
    lines += [f'{HEARTBEAT}{{slurm_job_id="{label(job)}"}} {now:.3f}' for job in job_ids]
    return "\n".join(lines) + "\n"


def sweep(folder: Path, node: str, now: float) -> None:
    """Remove the run metrics of jobs Slurm no longer has on ``node``; a heartbeat for every job there. When Slurm
    does not answer, nothing is removed and no heartbeat written: the dashboard marks the runs stale in a minute."""
    try:
        here = sorted({row[0] for row in slurm("squeue", "-h", "-w", node, "-o", "%A")})
    except (OSError, subprocess.SubprocessError):
        return
    for job_id, path in run_textfiles(folder).items():
        if job_id not in here:
            path.unlink(missing_ok=True)
    replace_if_changed(folder / HEARTBEAT_TEXTFILE, heartbeat_text(here, now))


def exporter_state(folder: Path, exporter: str, reason: str) -> None:
    path = folder / f"hpl_exporter_{exporter}.prom"
    if not reason:
        path.unlink(missing_ok=True)
        return
    text = (
        f"# HELP {EXPORTER_FAILED} {HELP[EXPORTER_FAILED]}\n# TYPE {EXPORTER_FAILED} gauge\n"
        f'{EXPORTER_FAILED}{{exporter="{label(exporter)}",reason="{label(reason)}"}} 1\n'
    )
    replace_if_changed(path, text)


def epilog_script(folder: str, *, python: str, script: str) -> str:
    """Slurm's epilog for a node: never fails (a failing epilog drains the node), quiet, no Slurm calls."""
    return (
        "#!/bin/sh\n# hyperpod-lora: the ended job's run metrics leave node exporter (lifecycle/slurm_metrics.py)\n"
        f"{python} {script} run-ended {folder} >/dev/null 2>&1\nexit 0\n"
    )


def efa_text(sysfs: Path) -> str:
    """Every port counter of every EFA device under ``sysfs``, as Prometheus counters by device and port."""
    series: dict[str, list[str]] = collections.defaultdict(list)
    for counters in sorted(sysfs.glob("*/ports/*/hw_counters")):
        device, port = counters.parent.parent.parent.name, counters.parent.name
        for path in sorted(counters.iterdir()):
            try:
                value = int(path.read_text().strip())
            except (OSError, ValueError):  # a counter the driver cannot read now, or not a number
                continue
            if EFA_COUNTER_NAME.fullmatch(path.name) and path.name not in EFA_NOT_COUNTERS:
                name = EFA_SERIES.format(counter=path.name)
                series[name].append(f'{name}{{device="{label(device)}",port="{label(port)}"}} {value}')
    lines = []
    for name, samples in sorted(series.items()):
        counter = name.removeprefix("hpl_efa_").removesuffix("_total")
        lines += [f"# HELP {name} EFA port counter {counter} (hw_counters/{counter})", f"# TYPE {name} counter"]
        lines += samples
    return "\n".join(lines) + "\n" if lines else ""


def slurm_conf_values(text: str) -> dict[str, str]:
    """slurm.conf's Key=Value settings (keys lower-cased; the last one wins, as in Slurm)."""
    values = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words and "=" in words[0]:
            key, _, value = words[0].partition("=")
            values[key.lower()] = value
    return values


def slurm_source(conf_text: str, version: str) -> tuple[str, str]:
    """("openmetrics", slurmctld's port) where slurmctld serves its own metrics, else ("poll", why not)."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if not numbers:
        return "poll", f"Slurm's version is unknown ({version!r})"
    if (int(numbers[1]), int(numbers[2])) < OPENMETRICS_SINCE:
        return "poll", f"Slurm {version} has no OpenMetrics endpoints (25.11 added them)"
    values = slurm_conf_values(conf_text)
    if values.get("metricstype", "").lower() != OPENMETRICS_TYPE:
        return "poll", f"slurm.conf does not set MetricsType={OPENMETRICS_TYPE} (HyperPod owns slurm.conf)"
    if values.get("privatedata"):
        return "poll", f"slurm.conf sets PrivateData={values['privatedata']}, which turns Slurm's metrics off"
    return "openmetrics", values.get("slurmctldport", SLURMCTLD_PORT).split("-")[0]


def this_node(argv: list[str], index: int) -> str:
    return argv[index] if len(argv) > index else socket.gethostname().split(".")[0]


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "cluster":
        folder = Path(argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        replace_if_changed(folder / TEXTFILE, cluster_text())
        return 0
    if len(argv) in (3, 4, 5) and argv[0] == "gpu-jobs" and argv[2].isdigit():
        folder = Path(argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        mapping = Path(argv[4]) if len(argv) == 5 else AMI_GPU_JOB_MAPPING
        print(f"GPU job mapping from {gpu_jobs(folder, int(argv[2]), this_node(argv, 3), mapping)}")
        return 0
    if len(argv) == 2 and argv[0] == "run-ended":
        job_id = os.environ.get("SLURM_JOB_ID", "")
        if job_id:
            run_ended(Path(argv[1]), job_id)
        return 0
    if len(argv) in (2, 3) and argv[0] == "sweep":
        sweep(Path(argv[1]), this_node(argv, 2), time.time())
        return 0
    if len(argv) in (3, 4) and argv[0] == "exporter-state":
        exporter_state(Path(argv[1]), argv[2], argv[3] if len(argv) == 4 else "")
        return 0
    if len(argv) in (2, 3) and argv[0] == "efa":
        replace_if_changed(Path(argv[1]) / EFA_TEXTFILE, efa_text(Path(argv[2] if len(argv) == 3 else EFA_SYSFS)))
        return 0
    if len(argv) == 3 and argv[0] == "slurm-source":
        conf = Path(argv[1])
        print(*slurm_source(conf.read_text() if conf.is_file() else "", argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "epilog-script":
        print(epilog_script(argv[1], python=argv[2], script=argv[3]), end="")
        return 0
    print(
        "error: usage: slurm_metrics.py cluster DIR | gpu-jobs DIR GPUS [NODE [AMI_MAPPING]] | run-ended DIR"
        " | sweep DIR [NODE] | efa DIR [SYSFS] | exporter-state DIR NAME [REASON] | slurm-source SLURM_CONF VERSION"
        " | epilog-script DIR PYTHON SCRIPT",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
