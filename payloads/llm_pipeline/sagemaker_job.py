"""The whole pipeline as one SageMaker training job: the command every container of the job runs.

    python3 -m llm_pipeline.sagemaker_job --config configs/<run>.toml [--from STEP] [--to STEP] [--no-smoke]

`hpctl job submit` builds the job with the sagemaker SDK; SageMaker starts the project's training
image on every host, the SDK's container driver exports SM_* and runs this command in the code
channel. It lays the job's facts over the HPL_* variables (jobs/sagemaker_env.py), then runs the
step modules the Slurm scripts run, in the same order, with the same arguments:

    prepare, download, data       every host (no shared file system: each host needs its own copy)
    precompile                    every host, only where Neuron devices exist (neuron_parallel_compile)
    train                         torchrun on every host, arguments from the job's hosts (jobs/launch.py);
                                  with several hosts, first they agree on the checkpoint to resume from
                                  and the first host sends the others its shared files of it
    gather                        several hosts: each sends its part of the newest checkpoint to the first
    consolidate, merge, generate  the first host only: its run folder now holds every host's shards

Unless --no-smoke, a smoke stage runs first inside the same job, on the instances already provisioned
(nothing is paid twice): after prepare, download and data, every later step on <run>/smoke with the
step counts cut (train saves at step 2, then resumes to 4; llm_pipeline/jobs/smoke.py), then the
estimate of the long steps (<run>/logs/estimate.json, from the smoke run's measured step time), then
the long steps. A job restarted with a checkpoint in the run folder (spot) passed its smoke stage
before and skips it. --to STEP stops the job after STEP, its smoke stage with it (it smokes only the
steps the job runs). Every step's output also goes to <run>/[smoke/]logs/<step>-<host>.log.

The first host's run folder is the job's checkpoint folder (synced to s3://<bucket>/outputs/<run>/,
restored to every host on a spot restart, when train resumes from its newest complete checkpoint);
the other hosts keep their run folders in scratch and put only their checkpoint parts and step logs
into the synced folder, so S3 holds one copy of each file (jobs/sagemaker_env.py). Finally the
adapter and the generated answer are copied to SM_MODEL_DIR (the job's model.tar.gz) and a step
summary to SM_OUTPUT_DATA_DIR.
A failed step stops the job with that step's exit status and names it in /opt/ml/output/failure,
which SageMaker reports as the job's FailureReason.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline import compile_cache, config, gather, submit
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs import chain, launch, pipeline_status, sagemaker_env, smoke
from llm_pipeline.jobs.chain import ChainJob
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import CHECKPOINT, StepLog, StepVerdict
from llm_pipeline.training import backends
from llm_pipeline.training.parts import FROM_BASE_MODEL
from llm_pipeline.weights.checkpoints import checkpoint_step

# The Slurm chain's order, plus gather after train: a job's hosts share no file system (gather.py).
STEPS = submit.JOB_STEPS
LEADER_ONLY_STEPS = tuple(job.step for job in submit.PIPELINE if job.leader_only)
COMPILING_STEPS = tuple(job.step for job in submit.PIPELINE if job.compiles)  # then the leader writes the cache back
PAYLOADS_DIR = Path(__file__).resolve().parents[1]
ACCELERATOR_ENV = PAYLOADS_DIR / "slurm" / "accelerator_env.sh"  # staged into the code channel by hpctl
SUMMARY_FILE = "pipeline-summary-{host}.json"


NATIVE_NEURON_FAMILY = "torchneuron"  # stacks/accelerators.TORCHNEURON, as the job's environment names it


def neuron_devices() -> bool:
    return bool(glob.glob("/dev/neuron[0-9]*"))


def accelerator_settings(env: dict[str, str], nodes: int) -> dict[str, str]:
    """``env`` after payloads/slurm/accelerator_env.sh, the file env.sh sources on the cluster: the same
    Neuron, NCCL and EFA settings from the instance facts hpctl put in the job's environment."""
    probe = 'set -euo pipefail; source "$0" >&2; env -0'
    result = subprocess.run(
        ["bash", "-c", probe, str(ACCELERATOR_ENV)], env={**env, "HPL_NODES": str(nodes)}, capture_output=True
    )
    if result.returncode != 0:
        raise sagemaker_env.SageMakerEnvError(f"{ACCELERATOR_ENV.name}: {result.stderr.decode().strip()}")
    return dict(item.split("=", 1) for item in result.stdout.decode().split("\0") if "=" in item)


def step_environment(env: dict[str, str], hosts: sagemaker_env.JobHosts) -> dict[str, str]:
    """What every step process gets: the job's HPL_* facts and the settings env.sh sets on the cluster."""
    result = sagemaker_env.job_environment(env)
    result["PYTHONPATH"] = os.pathsep.join(p for p in (str(PAYLOADS_DIR), env.get("PYTHONPATH", "")) if p)
    result["PYTHONUNBUFFERED"] = "1"
    return accelerator_settings(result, len(hosts.hosts))


def step_command(step: str, run_config: Path, env: dict[str, str], hosts: sagemaker_env.JobHosts) -> list[str] | str:
    """The command of one step on this host, or why the step has nothing to do here."""
    python = sys.executable
    if step == "precompile" and not neuron_devices():
        return "nothing to do on this host (no Neuron devices)"
    if step == "benchmark":  # the training image holds no vLLM (docs/benchmark.md)
        return "nothing to do in a training job: run the benchmark on the cluster (submit --from benchmark)"
    if step == "gather" and len(hosts.hosts) == 1:
        return "nothing to do (one host: its disk holds the whole checkpoint)"
    if submit.step_job(step).multi_node:  # torchrun on every host
        torchrun = [python, "-m", "torch.distributed.run", *launch.launch_args(env)]
        command = [*torchrun, "-m", "llm_pipeline.train", "--config", str(run_config)]
        if step != "precompile":
            return command
        # neuron_parallel_compile is torch-xla's tool; TorchNeuron (Trainium2) compiles as the steps run
        native = env.get("HPL_IMAGE_FAMILY") == NATIVE_NEURON_FAMILY
        return [*command, "--precompile"] if native else ["neuron_parallel_compile", *command, "--precompile"]
    return [python, "-m", f"llm_pipeline.{step}", "--config", str(run_config), *submit.step_job(step).job_args]


def persist_compile_cache(env: dict[str, str]) -> None:
    """The new compile cache entries to the stack's S3 prefix for the next job. A failure costs the
    next job its head start, not this job its result: it is printed and the job goes on."""
    try:
        compile_cache.persist(Path(env["HPL_COMPILE_CACHE_DIR"]), env[sagemaker_env.COMPILE_CACHE_URI_VARIABLE])
    except Exception as error:  # boto3 missing, access denied, throttled: all mean the same here
        print(f"== compile cache not persisted ({type(error).__name__}: {error}); the next job compiles again")


def write_failure(env: dict[str, str], message: str) -> None:
    """SageMaker shows the first 1 KiB of this file as the job's FailureReason."""
    failure = sagemaker_env.container_root(env) / "output" / "failure"
    try:
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(message + "\n")
    except OSError as exc:
        print(f"warning: could not write {failure}: {exc}", file=sys.stderr, flush=True)


def publish(cfg: config.RunConfig, env: dict[str, str]) -> None:
    """The adapter and the answer into SM_MODEL_DIR: the job's model.tar.gz is a usable adapter."""
    model_dir = Path(env.get("SM_MODEL_DIR") or sagemaker_env.container_root(env) / "model")
    model_dir.mkdir(parents=True, exist_ok=True)
    adapter = cfg.paths.adapter_dir
    if adapter.is_dir():
        shutil.copytree(adapter, model_dir / "adapter", dirs_exist_ok=True)
    if cfg.paths.generation_file.is_file():
        shutil.copy2(cfg.paths.generation_file, model_dir / cfg.paths.generation_file.name)
    print(f"== model artifact folder {model_dir}: {sorted(p.name for p in model_dir.iterdir())}", flush=True)


def write_summary(env: dict[str, str], host: str, record: dict) -> None:
    out = Path(env.get("SM_OUTPUT_DATA_DIR") or sagemaker_env.container_root(env) / "output" / "data")
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_FILE.format(host=host)).write_text(json.dumps(record, indent=2) + "\n")


def consolidate_source(run_config: Path, env: dict[str, str]) -> list[str]:
    """consolidate's --checkpoint: the whole checkpoint the gather step assembled, where it did."""
    cfg = config.load(run_config, env=env)
    gathered = sagemaker_env.gathered_dir(env, Path(cfg.paths.output_dir)) / cfg.paths.checkpoints_dir.name
    return ["--checkpoint", str(gathered)] if gathered.is_dir() else []


NEURON_SMOKE_RESUME = (
    "smoke stage on {hosts} hosts with the neuron engine: its resume run starts from the base model, because a "
    "Neuron checkpoint's tensor files are spread over the hosts and within one job each holds only its own "
    "(a spot restart restores them all to every host). The smoke proves training, saving, consolidation, merge "
    "and generation here, not the resume"
)


def agree_on_resume(run_config: Path, env: dict[str, str], hosts: sagemaker_env.JobHosts) -> Path | None:
    """Several hosts: the checkpoint this host's train resumes from, the same step on every host."""
    cfg = config.load(run_config, env=env)
    return gather.agree_on_resume(
        cfg.paths.checkpoints_dir,
        hosts,
        resume_dir=sagemaker_env.resume_dir(env, Path(cfg.paths.output_dir)) / cfg.paths.checkpoints_dir.name,
        # torch ranks read their own shards and the shared files; a Neuron resume reads every tensor file
        by_part=backends.resolve_backend(cfg.train.backend) == "torch",
    )


def job_plan(
    run_config: Path,
    cfg: config.RunConfig,
    first_step: str,
    hosts: sagemaker_env.JobHosts,
    *,
    smoke_stage: bool,
    last_step: str | None = None,
) -> list[tuple[ChainJob, RunFacts]]:
    """The steps in order, as the Slurm chain stages them (jobs/chain.py): with the smoke stage unless it
    is off or passed before (a checkpoint in the run folder: a restarted spot job)."""
    facts = RunFacts(config=run_config, output_dir=Path(cfg.paths.output_dir), nodes=len(hosts.hosts), run=cfg)
    jobs = [  # the job's steps (gather too) that the run asks for
        job for job in map(submit.step_job, submit.chain_steps(first_step, last_step, STEPS)) if job.wanted_by(cfg)
    ]
    if last_step:
        print(
            f"== the job stops after {last_step} (--to {last_step}): {', '.join(job.step for job in jobs)}", flush=True
        )
    if smoke_stage and chain.smoke_stage_runs(jobs, True) and CHECKPOINT.folders(cfg.paths.checkpoints_dir):
        print(f"== smoke stage: passed before ({cfg.paths.checkpoints_dir} holds checkpoints); not run again")
        smoke_stage = False
    elif not smoke_stage:
        print(f"== note: {smoke.NO_SMOKE_RISK}", flush=True)
    if chain.smoke_stage_runs(jobs, smoke_stage):
        smoke.write_smoke_run(facts)  # every host: each has its own run folder
        if len(hosts.hosts) > 1 and backends.resolve_backend(cfg.train.backend) != "torch":
            print(f"== note: {NEURON_SMOKE_RESUME.format(hosts=len(hosts.hosts))}", flush=True)
    return chain.staged_chain(facts, jobs, smoke_stage=smoke_stage)


def run_step(command: list[str], env: dict[str, str], log: Path) -> int:
    """Run one step; its output to the job's log (stdout) and to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with (
        log.open("w") as out,
        subprocess.Popen(
            command, env=env, cwd=PAYLOADS_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as process,
    ):
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.write(line)
        return process.wait()


def run(
    run_config: Path, *, first_step: str, env: dict[str, str], smoke_stage: bool = True, last_step: str | None = None
) -> int:
    submit.chain_steps(first_step, last_step, STEPS)  # a wrong --to before anything starts
    hosts = sagemaker_env.read_hosts(env)
    env = step_environment(env, hosts)
    sagemaker_env.link_model_channel(env)
    restored = sagemaker_env.restore_compile_cache(env)
    if restored:
        print(f"== compile cache: {restored} file(s) from earlier jobs in {env['HPL_COMPILE_CACHE_DIR']}", flush=True)
    cfg = config.load(run_config, env=env)
    linked = sagemaker_env.link_checkpoints(env, cfg.paths.checkpoints_dir)
    if linked is not None:
        print(f"== checkpoints: {cfg.paths.checkpoints_dir} -> {linked} (synced: this host's parts only)", flush=True)
    role = "leader" if hosts.is_leader else "worker"
    print(
        f"== job {env.get('TRAINING_JOB_NAME', '?')}: host {hosts.current} ({role}, {hosts.rank + 1} of "
        f"{len(hosts.hosts)}), run folder {cfg.paths.output_dir}, models {env['HPL_MODELS_DIR']}",
        flush=True,
    )
    record: dict = {"host": hosts.current, "hosts": list(hosts.hosts), "config": str(run_config), "steps": []}
    plan = job_plan(run_config, cfg, first_step, hosts, smoke_stage=smoke_stage, last_step=last_step)
    logs = [
        StepJob(
            step=job.step,
            job=hosts.current,
            log=str(sagemaker_env.synced_path(env, facts.logs_dir) / StepLog(job.step, hosts.current).name),
            nodes=chain.job_nodes(job, facts),
        )
        for job, facts in plan
    ]
    if hosts.is_leader:  # the estimate reads it; one copy in S3
        Path(cfg.paths.logs_dir).mkdir(parents=True, exist_ok=True)
        pipeline_status.write_record(Path(cfg.paths.logs_dir), run_config, logs)
    for (job, facts), step_log in zip(plan, logs, strict=True):
        step, name = smoke.long_step(job.step), job.step
        if step in (*LEADER_ONLY_STEPS, smoke.ESTIMATE_STEP) and not hosts.is_leader:
            continue
        if step == smoke.ESTIMATE_STEP:
            command = [sys.executable, "-m", "llm_pipeline.jobs.estimate", "--run-dir", str(facts.output_dir)]
            command += ["--config", str(facts.config), "--training-job"]
        else:
            command = step_command(step, facts.config, env, hosts)
            if step == "consolidate":
                command += consolidate_source(facts.config, env)
        if isinstance(command, str):
            print(f"== {name}: {command}", flush=True)
            skipped = Path(step_log.log)  # a log all the same: the estimate reads its smoke copy's run time
            skipped.parent.mkdir(parents=True, exist_ok=True)
            skipped.write_text(f"{command}\n{StepVerdict(name, 'COMPLETED', 0, 0).format()}\n")
            continue
        if step == "train" and len(hosts.hosts) > 1:
            resume = agree_on_resume(facts.config, env, hosts)
            start = f"step {checkpoint_step(resume) if resume else 0}"
            print(f"== {name}: every host starts from {start} (the newest checkpoint all hold their part of)")
            command = [*command, "--resume-from", str(resume or FROM_BASE_MODEL)]
        print(f"== {name}: {' '.join(command)}", flush=True)
        start = time.monotonic()
        code = run_step(command, env, Path(step_log.log))
        seconds = round(time.monotonic() - start, 1)
        record["steps"].append({"step": name, "exit": code, "seconds": seconds})
        verdict = StepVerdict(name, "COMPLETED" if code == 0 else "FAILED", code, round(seconds)).format()
        with open(step_log.log, "a") as out:  # the line the estimate reads a smoke job's run time from
            out.write(verdict + "\n")
        print(verdict, flush=True)
        if code != 0:
            write_summary(env, hosts.current, record)
            write_failure(
                env, f"pipeline step {name} failed on {hosts.current} (exit {code}); see its log lines ({step_log.log})"
            )
            return code
        if step in COMPILING_STEPS and hosts.is_leader and env.get(sagemaker_env.COMPILE_CACHE_URI_VARIABLE):
            persist_compile_cache(env)
    if hosts.is_leader:
        publish(cfg, env)
    write_summary(env, hosts.current, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.sagemaker_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path, metavar="RUN.toml", help="the run config")
    parser.add_argument("--from", dest="first_step", choices=STEPS, default=STEPS[0], help="start at this step")
    parser.add_argument("--to", dest="last_step", choices=STEPS, help="stop after this step (its smoke stage too)")
    parser.add_argument("--no-smoke", dest="smoke", action="store_false", help="skip the smoke stage (see above)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        return run(
            args.config.resolve(), first_step=args.first_step, env=env, smoke_stage=args.smoke, last_step=args.last_step
        )
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        write_failure(env, str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
