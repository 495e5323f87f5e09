"""The serve job of a run (`hpctl serve`), on the controller: submit it, wait for its endpoint, stop it.

    python3 -m llm_pipeline.jobs.serve_job submit --run-dir <run> [--hours H]
    python3 -m llm_pipeline.jobs.serve_job stop --run-dir <run>

submit sends slurm/serve.sbatch (the serve step, llm_pipeline.serve) to the run's partition with a time limit,
records its job id in <run>/serve/job and waits until the step writes <run>/serve/endpoint (host:port, once the
server answers); it prints `ENDPOINT_LINE<host>:<port> <job>`. stop cancels that job and waits until Slurm shows
it no more. Runs on the controller's python3 with the payloads on its path, like submit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import accounts, chain, deploy_facts, partitions, serving_image
from llm_pipeline.jobs.run_facts import RunFacts, read_run_facts
from llm_pipeline.run_files import PIPELINE_FILE, PipelineRecord, StepLog

JOB_NAME = "hpl-serve"  # hpctl status finds serve jobs by it (the run's name is the job's comment)
SERVE_DIR, ENDPOINT_FILE, JOB_FILE = "serve", "endpoint", "job"
ENDPOINT_LINE = "hpl-serve-endpoint="
DEFAULT_HOURS = 2.0  # the job's time limit unless --hours says otherwise: a forgotten server stops
ENDPOINT_WAIT_S = 1800  # the job's queue wait and the server's start (an 8B model loads in minutes)
POLL_S = 2


class ServeError(PipelineError):
    """The serve job cannot be submitted, found or stopped; the message says what to do."""


def serve_dir(run_dir: Path) -> Path:
    return run_dir / SERVE_DIR


def time_limit(hours: float) -> str:
    """sbatch --time in minutes (at least one)."""
    if hours <= 0:
        raise ServeError(f"--hours {hours}: the serve job's time limit must be above 0")
    return str(max(1, round(hours * 60)))


def queued(job: str) -> bool:
    """Whether Slurm still holds the job (pending, running or completing)."""
    found = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True, check=False)
    return found.returncode == 0 and job in found.stdout.split()


def recorded_job(run_dir: Path) -> str:
    path = serve_dir(run_dir) / JOB_FILE
    return path.read_text().strip() if path.is_file() else ""


def job_environment(run_dir: Path) -> tuple[RunFacts, dict[str, str]]:
    """The run's facts and what its serve job exports: the partition's, then the latest deploy's runtime and images
    (they win over the node profile's, as for a chain); refused in one line where the partition cannot serve."""
    record_file = run_dir / "logs" / PIPELINE_FILE
    if not record_file.is_file():
        raise ServeError(f"{record_file} is missing: serve a run that was submitted (hpctl submit)")
    facts = read_run_facts(PipelineRecord.from_json(record_file.read_text()).config)
    env = chain.partition_environment(facts, dict(os.environ))
    env.update(deploy_facts.read_deploy_facts(chain.PAYLOADS_DIR, partition=env.get("HPL_PARTITION")))
    serving_image.check_serving(["hpctl serve"], env)
    return facts, env


def endpoint_wait_s(env: dict[str, str]) -> float:
    """How long submit waits for the endpoint: the queue and the server's start, longer where the server may take
    longer to answer (Trainium: vLLM compiles the model when it starts)."""
    accelerator = env.get("HPL_ACCELERATOR", partitions.NO_ACCELERATOR)
    return ENDPOINT_WAIT_S + serving_image.server_start_limit_s(accelerator) - serving_image.SERVER_START_S


def sbatch_command(run_dir: Path, hours: float, facts: RunFacts, env: dict[str, str]) -> list[str]:
    """The serve job's sbatch line, from the run's facts and environment (job_environment)."""
    exports = ",".join(["ALL", *(f"{key}={value}" for key, value in chain.job_environment(facts, env).items())])
    command = [
        "sbatch",
        "--parsable",
        f"--job-name={JOB_NAME}",
        f"--comment={run_dir.name}",
        f"--time={time_limit(hours)}",
        f"--output={run_dir / 'logs' / StepLog('serve', '%j').name}",
        "--nodes=1",
        f"--export={exports},HPL_CHAIN_STEP=serve",
    ]
    if env.get("HPL_PARTITION"):
        command.append(f"--partition={env['HPL_PARTITION']}")
    return [*command, *accounts.sbatch_options(env), str(chain.PAYLOADS_DIR / "slurm" / "serve.sbatch")]


def submit(run_dir: Path, hours: float, wait_s: float | None = None) -> tuple[str, str]:
    """Submit the serve job and wait for its endpoint: (host:port, job id)."""
    running = recorded_job(run_dir)
    if running and queued(running):
        raise ServeError(f"run {run_dir.name} is already served by job {running}: stop it first (--stop)")
    folder = serve_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    endpoint = folder / ENDPOINT_FILE
    endpoint.unlink(missing_ok=True)  # an earlier job's
    facts, env = job_environment(run_dir)
    sent = subprocess.run(sbatch_command(run_dir, hours, facts, env), capture_output=True, text=True, check=False)
    if sent.returncode != 0:
        raise ServeError(f"sbatch refused the serve job: {sent.stderr.strip()}")
    job = sent.stdout.strip().split(";")[0]
    (folder / JOB_FILE).write_text(job + "\n")
    print(f"submitted serve job {job} ({hours:g} h limit), waiting for the server", flush=True)
    if wait_s is None:
        wait_s = endpoint_wait_s(env)
    deadline = time.monotonic() + wait_s
    while not endpoint.is_file():
        if not queued(job):
            log = run_dir / "logs" / StepLog("serve", job).name
            raise ServeError(f"serve job {job} ended before its server answered: see {log}")
        if time.monotonic() > deadline:
            raise ServeError(f"serve job {job} has no endpoint after {wait_s:g} s: stop it (--stop), see its log")
        time.sleep(POLL_S)
    return endpoint.read_text().strip(), job


def stop(run_dir: Path, wait_s: float = 120) -> str:
    """Cancel the run's serve job and wait until Slurm shows it no more; its id."""
    job = recorded_job(run_dir)
    if not job or not queued(job):
        raise ServeError(f"run {run_dir.name} has no serve job running")
    subprocess.run(["scancel", job], check=True)
    deadline = time.monotonic() + wait_s
    while queued(job):
        if time.monotonic() > deadline:
            raise ServeError(f"serve job {job} is still in the queue {wait_s:g} s after scancel: see squeue")
        time.sleep(POLL_S)
    (serve_dir(run_dir) / ENDPOINT_FILE).unlink(missing_ok=True)
    return job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.serve_job", description=__doc__)
    parser.add_argument("action", choices=("submit", "stop"))
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's folder")
    parser.add_argument("--hours", type=float, default=DEFAULT_HOURS, help="the job's time limit")
    args = parser.parse_args(argv)
    try:
        if args.action == "submit":
            endpoint, job = submit(args.run_dir, args.hours)
            print(f"{ENDPOINT_LINE}{endpoint} {job}", flush=True)
        else:
            print(f"cancelled serve job {stop(args.run_dir)}; nothing of it runs", flush=True)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
