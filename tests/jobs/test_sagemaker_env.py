"""The container's SageMaker facts as HPL_* values and torchrun arguments (jobs/sagemaker_env, launch)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from job_container import lay_out

from llm_pipeline import config
from llm_pipeline.jobs import launch, sagemaker_env
from llm_pipeline.jobs.run_config_text import write_derived

TINY = Path(__file__).resolve().parents[2] / "payloads" / "configs" / "tiny-cpu.toml"


def sm_env(root: Path, hosts: list[str], current: str, **extra: str) -> dict[str, str]:
    return {
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": current,
        "SM_MODEL_DIR": str(root / "model"),
        "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
        **extra,
    }


def test_channels_become_the_run_config_folders(tmp_path):
    root = tmp_path / "opt" / "ml"
    (root / "input/data/models").mkdir(parents=True)
    (root / "input/data/models/config.json").write_text("{}")  # the channel holds one model folder's files
    env = sm_env(
        root,
        ["algo-1"],
        "algo-1",
        SM_CHANNEL_MODELS=str(root / "input/data/models"),
        SM_CHANNEL_DATASETS=str(root / "input/data/datasets"),
        HPL_DEVICES_PER_NODE="8",
        HPL_MODEL_FOLDER="tiny-llama",
    )
    facts = sagemaker_env.pipeline_environment(env)
    assert facts["HPL_MODELS_DIR"] == str(root / "scratch" / "models")
    assert facts["HPL_DATASETS_DIR"] == str(root / "input/data/datasets")
    assert facts["HPL_OUTPUTS_DIR"] == str(root / "checkpoints")
    assert facts["HPL_DEVICES_PER_NODE"] == "8"
    # The tiny run config's ${HPL_*} paths resolve into the channels and the checkpoint folder.
    cfg = config.load(TINY, env={**env, **facts})
    assert sagemaker_env.link_model_channel(env) == Path(cfg.paths.model_dir)
    assert cfg.paths.model_dir == str(root / "scratch" / "models" / "tiny-llama")
    assert (Path(cfg.paths.model_dir) / "config.json").read_text() == "{}"  # the channel, under the run's name
    assert cfg.data.dataset == str(root / "input/data/datasets/tiny-dolly.jsonl")
    assert cfg.paths.output_dir == str(root / "checkpoints" / "tiny-lora")
    assert sagemaker_env.link_model_channel({**env, "HPL_MODEL_FOLDER": ""}) is None


def test_without_channels_inputs_go_to_scratch_and_devices_come_from_the_driver(tmp_path):
    root = tmp_path / "ml"
    facts = sagemaker_env.pipeline_environment(sm_env(root, ["algo-1"], "algo-1", SM_NUM_GPUS="4"))
    assert facts["HPL_MODELS_DIR"] == str(root / "scratch" / "models")
    assert facts["HPL_DATASETS_DIR"] == str(root / "scratch" / "datasets")
    assert facts["HPL_DEVICES_PER_NODE"] == "4"
    neuron = sagemaker_env.pipeline_environment(sm_env(root, ["algo-1"], "algo-1", SM_NUM_NEURONS="32"))
    assert neuron["HPL_DEVICES_PER_NODE"] == "32"


def test_only_the_first_host_keeps_its_run_folder_in_the_synced_checkpoint_folder(tmp_path):
    """The other hosts' run folders are in scratch; their checkpoints/ links into the synced folder and
    their step logs go there, under the same relative paths (S3 gets one copy of each file)."""
    root = tmp_path / "ml"
    first = sm_env(root, ["algo-1", "algo-2"], "algo-1")
    second = sm_env(root, ["algo-1", "algo-2"], "algo-2")
    assert sagemaker_env.pipeline_environment(first)["HPL_OUTPUTS_DIR"] == str(root / "checkpoints")
    assert sagemaker_env.pipeline_environment(second)["HPL_OUTPUTS_DIR"] == str(root / "scratch" / "outputs")
    cfg = config.load(TINY, env={**second, **sagemaker_env.pipeline_environment(second)})
    assert cfg.paths.output_dir == str(root / "scratch" / "outputs" / "tiny-lora")
    linked = sagemaker_env.link_checkpoints(second, cfg.paths.checkpoints_dir)
    assert linked == root / "checkpoints" / "tiny-lora" / "checkpoints" and linked.is_dir()
    assert cfg.paths.checkpoints_dir.resolve() == linked.resolve()
    assert sagemaker_env.link_checkpoints(second, cfg.paths.checkpoints_dir) == linked  # a second call: as it is
    assert sagemaker_env.synced_path(second, cfg.paths.logs_dir) == root / "checkpoints" / "tiny-lora" / "logs"
    assert sagemaker_env.gathered_dir(second, Path(cfg.paths.output_dir)) == root / "scratch" / "gathered" / "tiny-lora"
    leader = config.load(TINY, env={**first, **sagemaker_env.pipeline_environment(first)})
    assert sagemaker_env.link_checkpoints(first, leader.paths.checkpoints_dir) is None
    assert sagemaker_env.synced_path(first, leader.paths.logs_dir) == leader.paths.logs_dir


def test_hosts_are_sorted_and_ranked(tmp_path):
    hosts = sagemaker_env.read_hosts(sm_env(tmp_path, ["algo-3", "algo-1", "algo-2"], "algo-2"))
    assert hosts.hosts == ("algo-1", "algo-2", "algo-3")
    assert (hosts.rank, hosts.leader, hosts.is_leader) == (1, "algo-1", False)


def test_hosts_fall_back_to_resourceconfig_json(tmp_path):
    container = lay_out(tmp_path / "ml", host="algo-2", hosts=("algo-1", "algo-2"))
    hosts = sagemaker_env.read_hosts({"SM_MODEL_DIR": str(container.root / "model")})
    assert (hosts.hosts, hosts.current) == (("algo-1", "algo-2"), "algo-2")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, "not a JSON list"),
        ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}, "not one of the job's hosts"),
        ({"SM_HOSTS": "[]", "SM_CURRENT_HOST": "algo-1"}, "non-empty list"),
        ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_MASTER_PORT": "x"}, "SM_MASTER_PORT"),
        ({}, "resourceconfig.json does not exist"),
    ],
)
def test_bad_container_facts_are_named(tmp_path, env, message):
    with pytest.raises(sagemaker_env.SageMakerEnvError, match=message):
        sagemaker_env.read_hosts({"SM_MODEL_DIR": str(tmp_path / "model"), **env})


def test_launch_arguments_for_one_and_three_hosts(tmp_path):
    one = launch.launch_args(sm_env(tmp_path, ["algo-1"], "algo-1", HPL_DEVICES_PER_NODE="8"))
    assert one == ["--standalone", "--nnodes=1", "--nproc_per_node=8", "--max_restarts=0"]
    three = launch.launch_args(sm_env(tmp_path, ["algo-1", "algo-2", "algo-3"], "algo-3", HPL_DEVICES_PER_NODE="32"))
    assert three == [
        "--nnodes=3",
        "--nproc_per_node=32",
        "--node_rank=2",
        "--master_addr=algo-1",
        "--master_port=7777",
        "--max_restarts=0",
    ]
    with pytest.raises(launch.LaunchError, match="SLURM_JOB_NUM_NODES"):
        launch.launch_args({})  # neither a training job nor a Slurm allocation


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_hosts_form_one_world_with_these_arguments(tmp_path):
    # Two "hosts" on this machine: 127.0.0.1 sorts first and is the master, as algo-1 is in a job.
    hosts, port = ["localhost", "127.0.0.1"], free_port()
    agents = []
    for current in hosts:
        env = sm_env(tmp_path, hosts, current, SM_MASTER_PORT=str(port), HPL_DEVICES_PER_NODE="1")
        args = launch.launch_args(env)
        command = [sys.executable, "-m", "torch.distributed.run", *args, str(Path(__file__).with_name("rank_probe.py"))]
        agents.append(subprocess.Popen(command, env={**env, "PROBE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}))
    assert [agent.wait(timeout=120) for agent in agents] == [0, 0]
    seen = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")), key=lambda s: s["rank"])
    assert [(s["rank"], s["world"], s["sum"]) for s in seen] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert {s["node"] for s in seen} == {0, 1}


@pytest.mark.parametrize("backend", ["torch", "neuron"])
def test_a_smoke_stage_on_several_hosts_says_when_it_cannot_prove_the_resume(tmp_path, capsys, backend):
    """Within one job each host holds only its own part of a checkpoint: the torch engine's ranks resume
    from that and the shared files the first host sends; a Neuron resume reads every tensor file, so
    there the smoke's resume run starts from the base model and the job log says so."""
    from llm_pipeline import sagemaker_job

    root = tmp_path / "ml"
    env = sm_env(root, ["algo-1", "algo-2"], "algo-1")
    env = {**env, **sagemaker_env.pipeline_environment(env)}
    run_config = tmp_path / "run.toml"
    # the neuron backend pads every example (refusals.REFUSALS: no packing there)
    write_derived(TINY, run_config, {("train", "backend"): backend, ("data", "packing"): backend == "torch"})
    cfg = config.load(run_config, env=env)
    hosts = sagemaker_env.read_hosts(env)
    plan = sagemaker_job.job_plan(run_config, cfg, "prepare", hosts, smoke_stage=True)
    assert any(job.step.startswith("smoke-train") and job.step.endswith("-resume") for job, _ in plan)
    note = sagemaker_job.NEURON_SMOKE_RESUME.format(hosts=2)
    assert (note in capsys.readouterr().out) == (backend == "neuron")
