"""Job rehearsal: the command a SageMaker training job runs, executed here on the tiny config with
the container's folders and SM_* variables laid out under a temp root (no Docker, no AWS)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

import pytest
from checkpoint_sync import CheckpointSync
from job_container import Container, lay_out

from hpctl.jobs.job_spec import METRIC_DEFINITIONS, JobSpec, job_environment, stage_source
from llm_pipeline import config, sagemaker_job
from llm_pipeline.jobs import sagemaker_env, smoke
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.jobs.sagemaker_env import CONTAINER_ROOT, JobHosts
from llm_pipeline.run_files import BackendLine, ProgressLine, StepVerdict
from llm_pipeline.weights.adapter_files import open_adapter_folder
from tools import tiny_model as tiny

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


# The job `hpctl job submit --config tiny-cpu` builds (AWS-side fields do not matter here).
SPEC = JobSpec(
    run="tiny-lora",
    model="tiny-llama",
    config_file=TINY,
    instance_type="ml.m5.xlarge",
    instance_count=1,
    image_uri="unused",
    role_arn="unused",
    bucket="unused",
    channels={},
    environment={
        **job_environment("ml.m5.xlarge", devices_per_node=1, bucket="unused"),
        "HPL_MODEL_FOLDER": "tiny-llama",
    },
    spot=False,
    max_runtime_s=3600,
    max_wait_s=None,
    volume_size_gb=30,
    tags={},
)


def stage(container: Container) -> None:
    stage_source(SPEC, container.code_dir)  # what hpctl uploads as the code channel


def job_command(spec: JobSpec, *extra: str) -> list[str]:
    python, *args = shlex.split(spec.command)
    assert python == "python3"  # the image's interpreter; this venv's here
    return [sys.executable, *args, *extra]


def run_job(
    container: Container, channels: list[str], *extra: str, spec: JobSpec = SPEC
) -> subprocess.CompletedProcess[str]:
    env = container.environment(spec.environment, job_name="rehearsal", channels=channels)
    command = job_command(spec, *extra)
    return subprocess.run(command, cwd=container.code_dir, env=env, capture_output=True, text=True, timeout=600)


def completed(log: str) -> list[str]:
    """The steps a job's log says completed, in order."""
    return [v.step for line in log.splitlines() if (v := StepVerdict.parse(line)) and v.state == "COMPLETED"]


@pytest.mark.rehearsal
def test_job_runs_the_pipeline_into_the_checkpoint_folder(tmp_path):
    # `hpctl job submit --no-smoke`: the module's smoke stage (its order, its save and resume, the estimate)
    # is the two-host job's below, which runs the same staged chain on every host.
    container = lay_out(tmp_path / "opt" / "ml")
    stage(container)
    tiny.write_tiny_model(container.channel("models"))  # s3://<bucket>/models/tiny-llama/
    tiny.write_dolly_jsonl(container.channel("datasets") / "tiny-dolly.jsonl", 200)

    result = run_job(container, ["code", "models", "datasets"], spec=dataclasses.replace(SPEC, smoke=False))

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = completed(result.stdout)
    assert steps == ["prepare", "download", "data", "train", "consolidate", "merge", "generate", "evaluate"]
    assert smoke.NO_SMOKE_RISK in result.stdout  # the job says what skipping the smoke stage risks
    assert "nothing to do on this host (no Neuron devices)" in result.stdout  # precompile
    assert "already holds tiny-random-llama" in result.stdout  # the models channel, not the Hub
    run_dir = container.root / "checkpoints" / "tiny-lora"  # synced to s3://<bucket>/outputs/tiny-lora/
    assert not (run_dir / "smoke").exists() and not (run_dir / "logs" / "estimate.json").exists()
    assert (run_dir / "checkpoints" / "checkpoint-30").is_dir()
    assert open_adapter_folder(run_dir / "adapter").config["r"] == 8
    assert (run_dir / "merged" / "model.safetensors").stat().st_size > 0
    assert "### Answer" in (run_dir / "generation.txt").read_text()
    assert any((run_dir / "tensorboard").iterdir())
    # The model artifact (model.tar.gz) is the adapter and the answer; the summary is output data.
    assert sorted(p.name for p in (container.root / "model").iterdir()) == ["adapter", "generation.txt"]
    summary = json.loads((container.root / "output" / "data" / "pipeline-summary-algo-1.json").read_text())
    assert [s["step"] for s in summary["steps"] if "precompile" not in s["step"]] == steps
    assert {s["exit"] for s in summary["steps"]} == {0}
    assert not (container.root / "output" / "failure").exists()
    # SageMaker's metric definitions find the loss and the throughput in the job's log: train's 6 log events.
    for name in ("train:loss", "train:tokens_per_second"):
        values = re.findall(METRIC_DEFINITIONS[name], result.stdout)
        assert len(values) == 6 and all(float(value) > 0 for value in values), name


def test_a_failed_step_stops_the_job_and_names_itself(tmp_path):
    container = lay_out(tmp_path / "opt" / "ml")
    stage(container)
    tiny.write_tiny_model(container.channel("models"))  # s3://<bucket>/models/tiny-llama/
    (container.channel("datasets")).mkdir(parents=True)
    (container.channel("datasets") / "tiny-dolly.jsonl").write_text("")  # an empty dataset

    result = run_job(container, ["code", "models", "datasets"], "--from", "data")

    assert result.returncode == 2
    assert "is empty: there is nothing to train on" in result.stdout  # the step's output, its stderr too
    assert "is empty" in (container.root / "checkpoints" / "tiny-lora" / "logs" / "data-algo-1.log").read_text()
    assert "== data: FAILED (exit 2)" in result.stdout and "== train" not in result.stdout
    failure = (container.root / "output" / "failure").read_text()
    assert failure.startswith("pipeline step data failed on algo-1 (exit 2)")


def test_the_job_stops_after_the_step_to_names_and_refuses_one_before_from(tmp_path, monkeypatch, capsys):
    """--to STEP: the job's steps end there, its smoke stage's with them; a --to before --from is refused in one
    line naming the option, before anything runs, and written where SageMaker reads the FailureReason."""
    container = lay_out(tmp_path / "opt" / "ml", host="algo-1", hosts=("algo-1", "algo-2"))
    env = container.environment(SPEC.environment, job_name="rehearsal", channels=["code", "models", "datasets"])
    env |= sagemaker_env.pipeline_environment(env)
    run_config = write_derived(TINY, tmp_path / "tiny-full.toml", {("train", "method"): "full"})
    cfg, hosts = config.load(run_config, env=env), sagemaker_env.read_hosts(env)
    plans = {
        last: [
            job.step
            for job, _ in sagemaker_job.job_plan(run_config, cfg, "prepare", hosts, smoke_stage=True, last_step=last)
        ]
        for last in (None, "consolidate")
    }
    long = ["precompile", "train", "gather", "consolidate"]
    copies = [smoke.PREFIX + step for step in ("precompile", "train", "train-resume", "gather", "consolidate")]
    after = ["merge", "generate", "evaluate"]
    every = [*copies, *(smoke.PREFIX + step for step in after), "estimate", *long, *after]
    assert plans == {
        None: ["prepare", "download", "data", *every],
        "consolidate": ["prepare", "download", "data", *copies, "estimate", *long],
    }
    out = capsys.readouterr().out
    assert out.count("== the job stops after") == 1 and "== the job stops after consolidate (--to consolidate)" in out

    monkeypatch.setattr(os, "environ", env)
    assert sagemaker_job.main(["--config", str(run_config), "--from", "merge", "--to", "train"]) == 2
    refusal = "--to train: comes before --from merge; give a step from merge on"
    out, err = capsys.readouterr()
    assert err == f"error: {refusal}\n" and out == ""  # before the job's first line
    assert (container.root / "output" / "failure").read_text() == f"{refusal}\n"


SETTINGS = re.compile(r"^(NEURON_|FI_|NCCL_|MALLOC_ARENA_MAX$)")


def settings(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if SETTINGS.match(name)}


def cluster_settings(tmp_path: Path, facts: dict[str, str], nodes: int, cache: str) -> dict[str, str]:
    """What env.sh gives a Slurm step on a partition with these instance facts."""
    base = {"PATH": os.environ["PATH"], "HPL_PAYLOADS_DIR": str(REPO / "payloads"), "HPL_COMPILE_CACHE_DIR": cache}
    base |= {"HPL_RUN_CONFIG": str(tmp_path / "run.toml"), "HPL_RUN_DIR": str(tmp_path / "run")}
    env = {**base, **facts, "SLURM_JOB_NUM_NODES": str(nodes)}
    script = f"source {REPO / 'payloads' / 'slurm' / 'env.sh'} probe >/dev/null && env -0"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=True, cwd=tmp_path).stdout
    return settings(dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item))


@pytest.mark.parametrize(
    ("instance_type", "hosts", "expected", "absent"),
    [
        (
            "ml.trn1.32xlarge",
            2,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"},
            "NCCL_",
        ),
        ("ml.p4d.24xlarge", 2, {"FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_SOCKET_IFNAME": "^docker,lo,veth"}, "NEURON_"),
        ("ml.g5.12xlarge", 2, {"FI_PROVIDER": "efa"}, "FI_EFA_USE_DEVICE_RDMA"),  # EFA without device RDMA
        ("ml.g5.xlarge", 2, {"FI_EFA_USE_HUGE_PAGE": "0"}, "FI_PROVIDER"),  # no EFA on this size
        ("ml.p5.48xlarge", 1, {"NCCL_SOCKET_IFNAME": "^docker,lo,veth"}, "FI_PROVIDER"),  # one host
        ("ml.m5.xlarge", 2, {"MALLOC_ARENA_MAX": "64"}, "FI_PROVIDER NCCL_ NEURON_"),
    ],
)
def test_each_instance_type_gets_in_a_job_what_env_sh_sets_on_the_cluster(
    tmp_path, instance_type, hosts, expected, absent
):
    facts = job_environment(instance_type, devices_per_node=1, bucket="hpl-bucket")
    names = tuple(f"algo-{n}" for n in range(1, hosts + 1))
    container = {"SM_MODEL_DIR": str(tmp_path / "model"), "PATH": os.environ["PATH"], **facts}
    container |= {"SM_HOSTS": json.dumps(names), "SM_CURRENT_HOST": "algo-1"}
    job = settings(sagemaker_job.step_environment(container, JobHosts(hosts=names, current="algo-1")))
    assert job.items() >= expected.items()
    assert not [name for name in job if name.startswith(tuple(absent.split()))]
    cache = str(tmp_path / "scratch" / "neuron-cache")  # the job's HPL_COMPILE_CACHE_DIR
    assert job == cluster_settings(tmp_path, {k: v for k, v in facts.items() if k.startswith("HPL_")}, hosts, cache)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_host_config(tmp_path: Path, *, max_steps: int, keep: int = 2) -> Path:
    """Full fine-tuning on two hosts, a checkpoint every 2 steps, ``keep`` of them (save_total_limit)."""
    keys = {("parallel", "nodes"): 2, ("train", "method"): "full", ("train", "max_steps"): max_steps}
    keys |= {("train", "save_steps"): 2, ("train", "logging_steps"): 2, ("train", "save_total_limit"): keep}
    return write_derived(TINY, tmp_path / f"steps-{max_steps}-keep-{keep}" / "tiny-full-2hosts.toml", keys)


def step_losses(log: str, step: str) -> dict[int, float]:
    """The training step -> loss lines the first host printed while the job ran ``step``."""
    section = log[log.index(f"== {step}: ") : log.index(f"== {step}: COMPLETED")]
    return {line.step: line.loss for line in ProgressLine.parse_all(section)}


HOSTS = ("127.0.0.1", "localhost")  # 127.0.0.1 sorts first: algo-1's role


def two_host_job(root: Path, spec: JobSpec, prefix: Path, *extra: str, leave_out=frozenset()):
    """Both hosts run the job's command (its smoke stage on) with ``extra`` arguments, their checkpoint folders
    synced to ``prefix`` (a restart when it holds objects: restored first, but ``leave_out``). Returns the
    containers, the sync and the logs."""
    port, containers, processes = str(free_port()), [], []
    for host in HOSTS:
        container = lay_out(root / host / "opt" / "ml", host=host, hosts=HOSTS)
        stage_source(spec, container.code_dir)
        tiny.write_tiny_model(container.channel("models"))  # s3://<bucket>/models/tiny-llama/
        tiny.write_dolly_jsonl(container.channel("datasets") / "tiny-dolly.jsonl", 60)
        containers.append(container)
    # CheckpointConfig: LocalPath /opt/ml/checkpoints/<run> on every host, S3Uri s3://<bucket>/outputs/<run>/
    local = PurePosixPath(spec.checkpoint_local_path).relative_to(CONTAINER_ROOT)
    sync = CheckpointSync(prefix, {container.host: container.root / local for container in containers})
    sync.restore(leave_out=set(leave_out))
    for container in containers:
        env = container.environment(spec.environment, job_name="rehearsal", channels=["code", "models", "datasets"])
        env["SM_MASTER_PORT"] = port
        env["HF_HOME"] = str(container.root.parent / "hf-home")  # separate machines: caches of their own
        log = (root / f"{container.host}.log").open("w")
        command = job_command(spec, *extra)
        processes.append(subprocess.Popen(command, cwd=container.code_dir, env=env, stdout=log, stderr=log, text=True))
    finished = threading.Event()
    syncing = sync.run_until(finished)
    codes = [process.wait(timeout=900) for process in processes]
    finished.set()
    syncing.join(timeout=60)
    logs = [(root / f"{host}.log").read_text() for host in HOSTS]
    assert codes == [0, 0], logs[0][-4000:] + logs[1][-4000:]
    return containers, sync, logs


@pytest.mark.rehearsal
def test_two_hosts_fine_tune_with_fsdp_keep_one_copy_in_s3_and_resume_after_a_partial_restore(tmp_path):
    # Full fine-tuning, FSDP2 over two "hosts" (one process each) with separate disks: each rank
    # saves its own shard on its own host, and consolidate on the first host needs both.
    # The first job stops after consolidate (--to consolidate, its smoke stage too): generate and evaluate run
    # once, in the restart, on the model its consolidate writes.
    spec = dataclasses.replace(SPEC, config_file=two_host_config(tmp_path, max_steps=4), instance_count=2)
    prefix = tmp_path / "s3" / "outputs" / spec.run
    containers, sync, (leader, worker) = two_host_job(tmp_path / "job", spec, prefix, "--to", "consolidate")

    # The smoke stage's resume resumes on both hosts: each holds only its part of checkpoint-2 (the second
    # host gets the first host's shared files), and they train steps 3 and 4 only.
    smoke_checkpoint = r"\S+/smoke/checkpoints/checkpoint-2"
    for log in (leader, worker):
        assert "== smoke-train: every host starts from step 0" in log
        assert "== smoke-train-resume: every host starts from step 2" in log
        starts = [found for line in log.splitlines() if (found := BackendLine.parse(line))]
        assert any(
            found.backend == "torch" and re.fullmatch(rf"resuming from {smoke_checkpoint}", found.start)
            for found in starts
        ), log[-3000:]
    assert re.search(r"gather: received the shared files of checkpoint-2 from 127.0.0.1", worker)
    assert f"/scratch/resume/{spec.run}/smoke/checkpoints/checkpoint-2" in worker  # assembled outside the synced folder
    run_dir = containers[0].root / "checkpoints" / "tiny-lora"
    smoke_dir = run_dir / "smoke"
    resumed_log = (smoke_dir / "logs" / "smoke-train-resume-127.0.0.1.log").read_text()  # the step's own log
    assert f"resuming from {smoke_dir}/checkpoints/checkpoint-2" in resumed_log
    assert (smoke_dir / "merged" / "model.safetensors").is_file()  # the smoke steps after train on <run>/smoke:
    # smoke-consolidate writes a full fine-tuning's model where merge would
    saving, resumed = step_losses(leader, "smoke-train"), step_losses(leader, "smoke-train-resume")
    assert list(saving) == [1, 2] and list(resumed) == [3, 4]
    # The resume is exact on both hosts (weights, Adam state, schedule, data position): the long run
    # (the same config, logging every 2 steps: their mean) logs what the saved and the resumed smoke runs did.
    long = step_losses(leader, "train")
    assert long[2] == pytest.approx((saving[1] + saving[2]) / 2, abs=1e-4)
    assert long[4] == pytest.approx((resumed[3] + resumed[4]) / 2, abs=1e-4)
    assert "== train: every host starts from step 0" in leader and "== train: every host starts from step 0" in worker
    assert "gather: node 1 (127.0.0.1) sent its part of checkpoint-4" in leader
    gathered = r"\S+/scratch/gathered/tiny-lora/checkpoints"  # assembled in scratch, outside the synced folder
    assert re.search(rf"gather: checkpoint-4 is complete in {gathered}: the seals of all 2 hosts", leader)
    assert "gather: sent this host's part of checkpoint-4 to 127.0.0.1" in worker
    assert "== consolidate" not in worker  # the first host's steps only
    # The smoke stage first, on the instances already running, then the estimate and the long steps.
    every_host = ["prepare", "download", "data", "smoke-train", "smoke-train-resume", "smoke-gather"]
    assert completed(leader) == [*every_host, "smoke-consolidate", "estimate", "train", "gather", "consolidate"]
    assert completed(worker) == [*every_host, "train", "gather"]
    assert all("== the job stops after consolidate (--to consolidate)" in log for log in (leader, worker))
    estimate = json.loads((run_dir / "logs" / "estimate.json").read_text())
    train = next(row for row in estimate["steps"] if row["step"] == "train")
    assert "4 steps (train.max_steps)" in train["basis"] and "training job is billed" in estimate["note"]
    # SageMaker's metric definitions find the loss and the throughput in the job's log: the smoke run's
    # one event per step, then the long run's (every 2 steps).
    for name in ("train:loss", "train:tokens_per_second"):
        values = re.findall(METRIC_DEFINITIONS[name], leader)
        assert len(values) == smoke.SMOKE_STEPS + 2 and all(float(value) > 0 for value in values), name
    assert (run_dir / "merged" / "model.safetensors").stat().st_size > 0
    # S3 holds one copy of each file: the second host uploaded only its ranks' checkpoint files and its logs.
    assert sync.written_twice() == {}
    second = sorted(key for key, hosts in sync.writers.items() if hosts == {"localhost"})
    assert all(re.fullmatch(r"(smoke/)?logs/[\w-]+-localhost\.log", key) for key in second if "checkpoint-" not in key)
    own = (
        "hpl-complete-node1.json",
        "rng_state_1.pth",
        *(f"{part}/__1_0.distcp" for part in ("pytorch_model_fsdp_0", "optimizer_0")),
    )
    assert {key for key in second if key.startswith("checkpoints/checkpoint-4/")} == {
        f"checkpoints/checkpoint-4/{name}" for name in own
    }
    keys = sync.objects()
    first = {"merged/model.safetensors", "logs/pipeline.json", "data/stats.json"}
    first |= {"checkpoints/checkpoint-4/trainer_state.json"}
    assert first <= keys and all(sync.writers[key] == {"127.0.0.1"} for key in first)
    assert "logs/train-localhost.log" in keys and "logs/train-127.0.0.1.log" in keys

    # A spot restart: the job's command on a new pair of instances, every object restored but the second host's
    # model shard of checkpoint-4 (a restore cut short): the smoke stage is not run again, both resume from
    # checkpoint-2 (the same run: a checkpoint resumes only with what trained it, run_state) and save
    # checkpoint-4 again, keeping only it (a key that learns nothing); then the first host consolidates, merges,
    # generates and evaluates. It starts --from data: prepare and download would check what the first job did.
    spec = dataclasses.replace(spec, config_file=two_host_config(tmp_path, max_steps=4, keep=1))
    shard = "checkpoints/checkpoint-4/pytorch_model_fsdp_0/__1_0.distcp"
    restart = tmp_path / "restart"
    containers, sync, (leader, worker) = two_host_job(restart, spec, prefix, "--from", "data", leave_out={shard})

    run_dir = containers[0].root / "checkpoints" / "tiny-lora"
    assert f"resuming from {run_dir}/checkpoints/checkpoint-2" in leader
    for log in (leader, worker):  # they agree first, and delete the incomplete checkpoint-4 before saving it again
        assert "== smoke stage: passed before" in log
        assert "== train: every host starts from step 2" in log
        assert re.search(r"discarded \S+/checkpoint-4: (not complete on every host|incomplete, newer than)", log)
    every_host = ["data", "train", "gather"]
    assert completed(leader) == [*every_host, "consolidate", "merge", "generate", "evaluate"]
    assert completed(worker) == every_host
    assert (4, 4) in {(line.step, line.total) for line in ProgressLine.parse_all(leader)}
    # exact from the restored checkpoint-2: steps 3 and 4 as the uninterrupted long run trained them
    assert step_losses(leader, "train")[4] == pytest.approx(long[4], abs=1e-4)
    assert "gather: node 1 (127.0.0.1) sent its part of checkpoint-4" in leader
    assert StepVerdict.last(leader, "consolidate").state == "COMPLETED"
    assert sync.written_twice() == {}
    keys = sync.objects()
    assert shard in keys  # written again by the second host
    assert "### Answer" in (run_dir / "generation.txt").read_text()
    assert sync.writers["generation.txt"] == {"127.0.0.1"}  # the first host's steps only
    assert not any(key.startswith("checkpoints/checkpoint-2/") for key in keys)  # pruned on both hosts


def test_metric_definitions_read_every_field_of_the_progress_line(capsys):
    """On a GPU the progress line also carries MFU (no CPU peak is known, so the rehearsal has none)."""
    from types import SimpleNamespace

    from llm_pipeline.training.callbacks import MetricsLogger

    tokens = SimpleNamespace(real=0)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    args = SimpleNamespace(
        world_size=8, per_device_train_batch_size=1, gradient_accumulation_steps=1, output_dir="run/checkpoints"
    )
    state = SimpleNamespace(global_step=0, max_steps=10, is_world_process_zero=True)
    logger.on_train_begin(args, state, None)
    tokens.real, state.global_step = 4096, 5
    logger.on_log(args, state, None, logs={"loss": 1.25, "learning_rate": 1e-4, "mfu": 0.412})
    line = capsys.readouterr().out.splitlines()[-1]
    found = {name: re.findall(regex, line) for name, regex in METRIC_DEFINITIONS.items()}
    assert found["train:loss"] == ["1.2500"] and found["train:mfu_percent"] == ["41.2"], line
    assert len(found["train:tokens_per_second"]) == 1 and float(found["train:tokens_per_second"][0]) > 0
