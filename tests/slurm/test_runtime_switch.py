"""The runtime switch in env.sh and the image import in prepare.sbatch.

Pyxis, enroot, ECR and HyperPod's srun are not here, so stand-in `srun`, `enroot` and `aws`
commands record what the scripts ask of them (the way moto stands in for AWS). The host runtime
runs for real in test_pipeline.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import REPO

from llm_pipeline.run_files import StepMarker
from llm_pipeline.submit import main as submit_main

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-runtime_switch")]
REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
IMAGE = f"{REGISTRY}/cdk-hnb659fds-container-assets-123456789012-us-west-2:3f9a1c"
SQSH = "cdk-hnb659fds-container-assets-123456789012-us-west-2_3f9a1c.sqsh"
STAND_INS = {
    "srun": 'printf "%s\\n" "$@" >"$CALLS/srun.$$"; env >"$CALLS/srun-env.$$"',
    "aws": 'echo "$*" >"$CALLS/aws"; echo ecr-password-123',
    # records the credentials enroot would read, then writes the image where it was told to
    "enroot": 'echo "$*" >"$CALLS/enroot"; cp "$ENROOT_CONFIG_PATH/.credentials" "$CALLS/credentials"; '
    'stat -c %a "$ENROOT_CONFIG_PATH/.credentials" >"$CALLS/credentials.mode"; '
    'echo "$ENROOT_CONFIG_PATH" >"$CALLS/config_path"; echo squashfs >"$3"',
}


@pytest.fixture()
def node(tmp_path):
    """A fake compute node: stand-in commands first on PATH and the job environment submit gives."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, body in STAND_INS.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\nset -eu\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "SLURM_JOB_ID": "77",
        "HPL_PAYLOADS_DIR": str(REPO / "payloads"),
        "HPL_RUN_CONFIG": "/fsx/payloads/configs/run.toml",
        "HPL_RUN_DIR": str(tmp_path / "run"),
        "HPL_FSX_MOUNT_PATH": "/fsx",
        "HPL_IMAGES_DIR": str(tmp_path / "images"),
        "HPL_SAGEMAKER_CLUSTER_DIR": str(tmp_path / "not-hyperpod"),
    }
    return env, calls


def run_step(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "payloads" / "slurm" / script)], env=env, capture_output=True, text=True)


def srun_calls(calls: Path) -> list[list[str]]:
    return [path.read_text().splitlines() for path in sorted(calls.glob("srun.*"))]


def test_pyxis_prepare_imports_the_ecr_image_once_then_checks_inside_it(node, tmp_path):
    env, calls = node
    env.update(HPL_RUNTIME="pyxis", HPL_IMAGE_URI=IMAGE)
    first = run_step("prepare.sbatch", env)
    assert first.returncode == 0, first.stdout + first.stderr

    image = tmp_path / "images" / SQSH
    assert image.read_text() == "squashfs\n"
    assert (calls / "aws").read_text().split() == ["ecr", "get-login-password", "--region", "us-west-2"]
    assert (calls / "enroot").read_text().split() == [
        "import",
        "--output",
        f"{image}.partial-77",
        f"docker://{REGISTRY}#{IMAGE.split('/', 1)[1]}",
    ]
    assert (calls / "credentials").read_text() == f"machine {REGISTRY} login AWS password ecr-password-123\n"
    assert (calls / "credentials.mode").read_text().strip() == "600"
    assert not Path((calls / "config_path").read_text().strip()).exists()  # the credentials are gone after the import
    [srun] = srun_calls(calls)
    assert srun[:5] == [
        "--kill-on-bad-exit=1",
        f"--container-image={image}",
        "--container-mounts=/fsx:/fsx",
        f"--container-workdir={REPO / 'payloads'}",
        "--nodes=1",
    ]
    assert srun[6:] == ["python3", "-m", "llm_pipeline.prepare", "--config", "/fsx/payloads/configs/run.toml"]

    (calls / "enroot").unlink()
    again = run_step("prepare.sbatch", env)
    assert again.returncode == 0 and f"image already imported: {image}" in again.stdout
    assert not (calls / "enroot").exists()


def test_the_trn2_training_step_runs_in_the_image_with_the_chains_cache_and_efa(node, tmp_path):
    """Two trn2 nodes under Pyxis: srun carries the image, the FSx mount and --container-env for the compile
    cache (the image sets its own, which would win), and its environment the EFA variables of
    accelerator_env.sh, the file the acceptance's levels use too (tests/infra/test_infra_trn2.py)."""
    env, calls = node
    env.update(
        HPL_RUNTIME="pyxis",
        HPL_IMAGE_URI=IMAGE,
        HPL_ACCELERATOR="neuron",
        HPL_IMAGE_FAMILY="torchneuron",
        HPL_EFA_INTERFACES="16",
        HPL_EFA_DEVICE_RDMA="1",
        HPL_COMPILE_CACHE_DIR="/fsx/neuron-cache",
        SLURM_JOB_NUM_NODES="2",
        # the recovery loop around training reads the run config on the host (a real one: python runs there)
        HPL_RUN_CONFIG=str(REPO / "payloads" / "configs" / "tiny-cpu.toml"),
        HPL_OUTPUTS_DIR=str(tmp_path / "outputs"),
        HPL_MODELS_DIR=str(tmp_path / "models"),
        HPL_DATASETS_DIR=str(tmp_path / "datasets"),
    )
    out = run_step("train.sbatch", env)
    assert out.returncode == 0, out.stdout + out.stderr
    [srun] = srun_calls(calls)
    assert srun[:6] == [
        "--kill-on-bad-exit=1",
        f"--container-image={tmp_path / 'images' / SQSH}",
        "--container-mounts=/fsx:/fsx",
        f"--container-workdir={REPO / 'payloads'}",
        "--container-env=TORCH_NEURONX_NEFF_CACHE_DIR",
        "--ntasks-per-node=1",
    ]
    assert srun[6:12] == ["python3", "-m", "llm_pipeline.jobs.launch", "--exec", "--", "-m"]
    [recorded] = calls.glob("srun-env.*")
    seen = dict(line.split("=", 1) for line in recorded.read_text().splitlines() if "=" in line)
    wanted = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
    wanted["TORCH_NEURONX_NEFF_CACHE_DIR"] = "/fsx/neuron-cache/torchneuron"
    assert {name: seen.get(name) for name in wanted} == wanted


def test_host_runtime_uses_the_host_python_and_hyperpod_adds_auto_resume(node, tmp_path):
    env, calls = node
    env.update(HPL_RUNTIME="host", PYTHON="/opt/venv/bin/python", HPL_SAGEMAKER_CLUSTER_DIR=str(tmp_path))
    out = run_step("merge.sbatch", env)
    assert out.returncode == 0, out.stderr
    assert srun_calls(calls) == [
        [
            "--kill-on-bad-exit=1",
            "--auto-resume=1",
            "--nodes=1",
            "--ntasks=1",
            "/opt/venv/bin/python",
            "-m",
            "llm_pipeline.merge",
            "--config",
            "/fsx/payloads/configs/run.toml",
        ]
    ]
    assert StepMarker.from_json((tmp_path / "run" / "logs" / "state" / "merge.json").read_text()).state == "COMPLETED"


def test_a_failing_launch_marks_the_step_failed(node, tmp_path):
    env, _ = node
    (Path(env["PATH"].split(":")[0]) / "srun").write_text("#!/usr/bin/env bash\nexit 3\n")
    out = run_step("generate.sbatch", env)
    assert out.returncode == 3 and "== generate: FAILED (exit 3)" in out.stdout
    failed = StepMarker.from_json((tmp_path / "run" / "logs" / "state" / "generate.json").read_text())
    assert (failed.state, failed.exit_code) == ("FAILED", 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"HPL_RUNTIME": "docker"}, "error: HPL_RUNTIME=docker is not a runtime (use host or pyxis)"),
        ({"HPL_RUNTIME": "pyxis"}, "HPL_IMAGE_URI: is not set: the cluster facts name the training image"),
        ({"HPL_RUN_CONFIG": ""}, "HPL_RUN_CONFIG: is not set: submit with python3 -m llm_pipeline.submit"),
    ],
)
def test_bad_environment_stops_the_step_with_a_reason(node, change, message):
    env, calls = node
    env.pop("HPL_IMAGE_URI", None)
    out = run_step("download.sbatch", {**env, **change})
    assert out.returncode != 0 and message in out.stderr
    assert srun_calls(calls) == []


def test_submit_refuses_a_pyxis_run_outside_fsx(tmp_path, monkeypatch, capsys):
    config = tmp_path / "run.toml"
    config.write_text("[paths]\noutput_dir = '/fsx/outputs/x'\n")
    monkeypatch.setenv("HPL_RUNTIME", "pyxis")
    monkeypatch.setenv("HPL_FSX_MOUNT_PATH", "/fsx")
    assert submit_main(["--config", str(config), "--dry-run"]) == 2
    assert f"run config {config} is outside /fsx" in capsys.readouterr().err


SERVING_IMAGE = f"{REGISTRY}/cdk-hnb659fds-container-assets-123456789012-us-west-2:9c2e7d"
SERVING_SQSH = "cdk-hnb659fds-container-assets-123456789012-us-west-2_9c2e7d.sqsh"


def serving_node(node, tmp_path, config_text: str) -> tuple[dict[str, str], Path]:
    """The Pyxis node with both images in its facts and a real run config (the host's Python reads it)."""
    env, calls = node
    config = tmp_path / "run.toml"
    config.write_text(config_text)
    env.update(
        HPL_RUNTIME="pyxis", HPL_IMAGE_URI=IMAGE, HPL_SERVING_IMAGE_URI=SERVING_IMAGE, HPL_RUN_CONFIG=str(config)
    )
    return env, calls


def test_prepare_imports_the_serving_image_only_for_a_run_that_starts_a_vllm_server(node, tmp_path):
    env, calls = serving_node(node, tmp_path, "")
    plain = run_step("prepare.sbatch", env)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    images = tmp_path / "images"
    assert sorted(path.name for path in images.iterdir()) == [SQSH]

    (tmp_path / "run.toml").write_text('[benchmark]\ntasks = ["arc_challenge:25"]\n')
    benchmarking = run_step("prepare.sbatch", env)
    assert benchmarking.returncode == 0, benchmarking.stdout + benchmarking.stderr
    assert f"image already imported: {images / SQSH}" in benchmarking.stdout
    assert (calls / "enroot").read_text().split()[-1] == f"docker://{REGISTRY}#{SERVING_IMAGE.split('/', 1)[1]}"
    assert sorted(path.name for path in images.iterdir()) == sorted([SQSH, SERVING_SQSH])
    # the prepare step's own check still runs in the training image
    assert all(f"--container-image={images / SQSH}" in call for call in srun_calls(calls))


def test_the_benchmark_step_runs_vllm_in_the_serving_image_and_refuses_without_one(node, tmp_path):
    env, calls = serving_node(node, tmp_path, '[benchmark]\ntasks = ["arc_challenge:25"]\n')
    out = run_step("benchmark.sbatch", env)
    assert out.returncode == 0, out.stdout + out.stderr
    [srun] = srun_calls(calls)  # the chart's step runs only after a benchmark.json (the stand-in writes none)
    assert srun[1] == f"--container-image={tmp_path / 'images' / SERVING_SQSH}"
    assert srun[-5:] == ["python3", "-m", "llm_pipeline.benchmark", "--config", str(tmp_path / "run.toml")]

    for path in calls.glob("srun*"):
        path.unlink()
    env.pop("HPL_SERVING_IMAGE_URI")
    refused = run_step("benchmark.sbatch", env)
    assert refused.returncode != 0
    assert "HPL_SERVING_IMAGE_URI: is not set: the deploy facts name no serving image" in refused.stderr
    assert srun_calls(calls) == []


def test_the_serve_job_imports_the_serving_image_then_serves_in_it(node, tmp_path):
    env, calls = serving_node(node, tmp_path, "")
    out = run_step("serve.sbatch", env)
    assert out.returncode == 0, out.stdout + out.stderr
    image = tmp_path / "images" / SERVING_SQSH
    assert image.read_text() == "squashfs\n"
    [srun] = srun_calls(calls)
    assert srun[1] == f"--container-image={image}"
    assert srun[-5:-2] == ["python3", "-m", "llm_pipeline.serve"]


@pytest.mark.parametrize(("nodes", "placement"), [("1", "colocated"), ("2", "node")])
def test_a_grpo_train_step_serves_rollouts_from_the_serving_image_and_trains_in_the_training_image(
    node, tmp_path, nodes, placement
):
    """GRPO under Pyxis: the rollout server's srun carries the serving image (beside the trainer with --overlap on
    one node; on the last node of two, the trainer excluding it), the trainer's the training image; the trainer
    starts once the server wrote its address, and the server is stopped when the step ends. The stand-in srun of
    the server writes the address as the real one does, then serves until it is stopped."""
    env, calls = node
    run = tmp_path / "outputs" / "grpo"
    text = (
        f'[paths]\noutput_dir = "{run}"\nmodel_dir = "{tmp_path / "models" / "base"}"\n'
        f'[train]\nobjective = "grpo"\n[data]\npacking = false\n[parallel]\nnodes = {nodes}\n'
    )
    env, calls = serving_node((env, calls), tmp_path, text)
    server_srun = Path(env["PATH"].split(":")[0]) / "srun"
    server_srun.write_text(  # bash itself, not env: the process keeps the name srun, which the step's stop looks for
        "#!/bin/bash\nset -eu\n"
        'printf "%s\\n" "$@" >"$CALLS/srun.$(date +%s%N).$$"\n'
        'if [[ " $* " == *" llm_pipeline.rollout_server "* ]]; then\n'
        f'  mkdir -p "{run}/rollout"; echo 127.0.0.1:9 >"{run}/rollout/endpoint"\n'
        '  trap "kill \\$!; echo stopped >$CALLS/server-stopped; exit 0" TERM; sleep 60 & wait\n'
        "fi\n"
    )
    scontrol = server_srun.with_name("scontrol")  # `scontrol show hostnames` without a cluster to ask
    scontrol.write_text('#!/usr/bin/env bash\n[[ "$3" == "node[1-2]" ]] && printf "node1\\nnode2\\n" || echo "$3"\n')
    scontrol.chmod(0o755)
    env.update(
        SLURM_JOB_NUM_NODES=nodes,
        SLURM_JOB_NODELIST="node[1-2]" if nodes == "2" else "node1",
        HPL_OUTPUTS_DIR=str(tmp_path / "outputs"),
        HPL_MODELS_DIR=str(tmp_path / "models"),
        HPL_DATASETS_DIR=str(tmp_path / "datasets"),
    )
    out = run_step("train.sbatch", env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"== GRPO: the rollout server ({placement}) on node{nodes}" in out.stdout
    server, trainer = srun_calls(calls)  # in the order they started
    assert server[1] == f"--container-image={tmp_path / 'images' / SERVING_SQSH}"
    assert ["--overlap", f"--nodelist=node{nodes}"] == [
        arg for arg in server if arg.startswith(("--overlap", "--nodelist"))
    ]
    assert server[-5:-2] == ["python3", "-m", "llm_pipeline.rollout_server"]
    assert trainer[1] == f"--container-image={tmp_path / 'images' / SQSH}"
    excluded = ["--nodes=1", "--exclude=node2"] if placement == "node" else []
    assert [arg for arg in trainer if arg.startswith(("--nodes=", "--exclude="))] == excluded
    assert "llm_pipeline.train" in trainer
    assert (calls / "server-stopped").read_text() == "stopped\n"
