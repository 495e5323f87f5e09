"""Job rehearsal: the command a SageMaker training job runs, executed here on the tiny config with
the container's folders and SM_* variables laid out under a temp root (no Docker, no AWS)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from job_container import Container, lay_out

from hpctl.job_spec import JobSpec, job_environment, stage_source
from llm_pipeline import sagemaker_job
from llm_pipeline.weights.adapter_files import open_adapter_folder
from tools import tiny_model as tiny

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


# The job `hpctl job submit --config tiny-cpu` builds (AWS-side fields do not matter here).
SPEC = JobSpec(
    run="tiny-lora",
    config_file=TINY,
    instance_type="ml.m5.xlarge",
    instance_count=1,
    image_uri="unused",
    role_arn="unused",
    bucket="unused",
    channels={},
    environment=job_environment("ml.m5.xlarge", devices_per_node=1),
    spot=False,
    max_runtime_s=3600,
    max_wait_s=None,
    volume_size_gb=30,
    tags={},
)


def stage(container: Container) -> None:
    stage_source(SPEC, container.code_dir)  # what hpctl uploads as the code channel


def run_job(container: Container, channels: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    env = container.environment(SPEC.environment, job_name="rehearsal", channels=channels)
    python, *args = shlex.split(SPEC.command)
    assert python == "python3"  # the image's interpreter; this venv's here
    command = [sys.executable, *args, *extra]
    return subprocess.run(command, cwd=container.code_dir, env=env, capture_output=True, text=True, timeout=600)


def test_job_runs_the_pipeline_into_the_checkpoint_folder(tmp_path):
    container = lay_out(tmp_path / "opt" / "ml")
    stage(container)
    tiny.write_tiny_model(container.channel("models") / "tiny-llama")
    tiny.write_dolly_jsonl(container.channel("datasets") / "tiny-dolly.jsonl", 200)

    result = run_job(container, ["code", "models", "datasets"])

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = re.findall(r"^== (\w+): COMPLETED", result.stdout, flags=re.MULTILINE)
    assert steps == ["prepare", "download", "data", "train", "consolidate", "merge", "generate"]
    assert "nothing to do on this host (no Neuron devices)" in result.stdout  # precompile
    assert "already holds tiny-random-llama" in result.stdout  # the models channel, not the Hub
    run_dir = container.root / "checkpoints" / "tiny-lora"  # synced to s3://<bucket>/outputs/tiny-lora/
    assert (run_dir / "checkpoints" / "checkpoint-30").is_dir()
    assert open_adapter_folder(run_dir / "adapter").config["r"] == 8
    assert (run_dir / "merged" / "model.safetensors").stat().st_size > 0
    assert "### Answer" in (run_dir / "generation.txt").read_text()
    assert any((run_dir / "tensorboard").iterdir())
    # The model artifact (model.tar.gz) is the adapter and the answer; the summary is output data.
    assert sorted(p.name for p in (container.root / "model").iterdir()) == ["adapter", "generation.txt"]
    summary = json.loads((container.root / "output" / "data" / "pipeline-summary-algo-1.json").read_text())
    assert [s["step"] for s in summary["steps"]] == steps and {s["exit"] for s in summary["steps"]} == {0}
    assert not (container.root / "output" / "failure").exists()


def test_a_failed_step_stops_the_job_and_names_itself(tmp_path):
    container = lay_out(tmp_path / "opt" / "ml")
    stage(container)
    tiny.write_tiny_model(container.channel("models") / "tiny-llama")
    (container.channel("datasets")).mkdir(parents=True)
    (container.channel("datasets") / "tiny-dolly.jsonl").write_text("")  # an empty dataset

    result = run_job(container, ["code", "models", "datasets"], "--from", "data")

    assert result.returncode == 2
    assert "is empty: there is nothing to train on" in result.stderr
    assert "== data: FAILED (exit 2)" in result.stdout and "== train" not in result.stdout
    failure = (container.root / "output" / "failure").read_text()
    assert failure.startswith("pipeline step data failed on algo-1 (exit 2)")


def test_job_sets_what_slurm_env_sh_sets(tmp_path):
    env_sh = (REPO / "payloads" / "slurm" / "env.sh").read_text()
    hosts = sagemaker_job.sagemaker_env.JobHosts(hosts=("algo-1", "algo-2"), current="algo-1")
    env = sagemaker_job.step_environment({"SM_MODEL_DIR": str(tmp_path / "model")}, hosts)
    for name, value in re.findall(r"^export (NEURON_FUSE_SOFTMAX|NEURON_RT_\w+|MALLOC_ARENA_MAX)=(\S+)$", env_sh, re.M):
        assert env[name] == value, name
    default_flags = re.search(r'NEURON_CC_FLAGS="\$\{NEURON_CC_FLAGS:-([^}]*)\}"', env_sh).group(1)
    assert env["NEURON_CC_FLAGS"] == f"{default_flags} --cache_dir={tmp_path}/scratch/neuron-cache"
    assert env["FI_PROVIDER"] == "efa"  # more than one host, as env.sh does for more than one node
