"""The serve job's controller side and step, without vLLM: a run already served is refused before sbatch (squeue and
sbatch are stand-ins on PATH that record their calls), and the step picks the adapter over the base, else the merged
model, with a --max-lora-rank vLLM takes. The served job itself: tests/slurm/test_serve_rehearsal.py."""

from __future__ import annotations

import json

import pytest

from llm_pipeline.config import load
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import serve_job
from llm_pipeline.serve import TUNED_NAME, lora_rank, what_to_serve


def stand_in(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_a_run_whose_serve_job_is_queued_is_refused_before_sbatch(tmp_path, monkeypatch):
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    (run_dir / serve_job.SERVE_DIR).mkdir(parents=True)
    (run_dir / serve_job.SERVE_DIR / serve_job.JOB_FILE).write_text("41\n")
    stand_in(bin_dir, "squeue", 'echo "$@" >> "$0.calls"; echo 41')
    stand_in(bin_dir, "sbatch", 'echo "$@" >> "$0.calls"; echo 42')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(serve_job.ServeError, match="already served by job 41: stop it first"):
        serve_job.submit(run_dir, 1.0, wait_s=0)
    assert "-j 41" in (bin_dir / "squeue.calls").read_text()
    assert not (bin_dir / "sbatch.calls").exists()


def test_the_time_limit_is_in_whole_minutes_and_must_be_positive():
    assert (serve_job.time_limit(0.5), serve_job.time_limit(2), serve_job.time_limit(0.001)) == ("30", "120", "1")
    with pytest.raises(serve_job.ServeError, match="must be above 0"):
        serve_job.time_limit(0)


def test_the_adapter_is_served_over_the_base_else_the_merged_model(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'[paths]\nmodel_dir = "{tmp_path / "base"}"\noutput_dir = "{run_dir}"\n')
    with pytest.raises(StepError, match="neither an adapter"):
        what_to_serve(load(config))
    (run_dir / "merged").mkdir(parents=True)
    (run_dir / "merged" / "config.json").write_text("{}")
    assert what_to_serve(load(config)) == (run_dir / "merged", TUNED_NAME, [])
    (run_dir / "adapter").mkdir()
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 24}))
    model, name, extra = what_to_serve(load(config))
    assert (model, name) == (tmp_path / "base", "base")
    assert extra == ["--enable-lora", "--lora-modules", f"tuned={run_dir / 'adapter'}", "--max-lora-rank", "32"]
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(StepError, match="above vLLM's largest"):
        lora_rank(run_dir / "adapter")


def test_on_pyxis_the_serve_job_takes_the_deploys_serving_image_or_is_refused_before_sbatch(tmp_path, monkeypatch):
    """The serve job reads the latest deploy's facts as a chain does: their serving image reaches the job
    (HPL_SERVING_IMAGE_URI); a deploy before serving images is refused in one line, before any sbatch."""
    from llm_pipeline.jobs import chain, deploy_facts
    from llm_pipeline.jobs.serving_image import ServingImageError
    from llm_pipeline.run_files import PIPELINE_FILE, PipelineRecord

    payloads, run_dir = tmp_path / "payloads", tmp_path / "fsx" / "outputs" / "run"
    payloads.mkdir()
    (run_dir / "logs").mkdir(parents=True)
    config = tmp_path / "fsx" / "run.toml"
    config.write_text(f'[paths]\noutput_dir = "{run_dir}"\n')
    (run_dir / "logs" / PIPELINE_FILE).write_text(PipelineRecord(str(config), ()).to_json())
    partition = {"accelerator": "cuda", "devices_per_node": 8, "efa_interfaces": 32, "efa_device_rdma": 1, "fp8": 1}
    serving = "1.dkr.ecr.us-west-2.amazonaws.com/assets:serve"

    def deploy(facts: dict) -> None:
        written = {
            "runtime": "pyxis",
            "default_partition": "p5",
            "partition_images": {"p5": "1.dkr.ecr.us-west-2.amazonaws.com/assets:train"},
            "partitions": {"p5": {**partition, **facts}},
        }
        (payloads / deploy_facts.DEPLOY_FACTS_FILE).write_text(json.dumps(written))

    monkeypatch.setattr(chain, "PAYLOADS_DIR", payloads)
    monkeypatch.setenv("HPL_FSX_MOUNT_PATH", str(tmp_path / "fsx"))
    deploy({})
    with pytest.raises(
        ServingImageError, match=r"^hpctl serve start\(s\) a vLLM server on the nodes, and partition p5"
    ):
        serve_job.sbatch_command(run_dir, 1.0, *serve_job.job_environment(run_dir))
    deploy({"serving_image_uri": serving})
    command = serve_job.sbatch_command(run_dir, 1.0, *serve_job.job_environment(run_dir))
    (export,) = [option for option in command if option.startswith("--export=")]
    assert f"HPL_SERVING_IMAGE_URI={serving}" in export.split(",") and "HPL_RUNTIME=pyxis" in export.split(",")
    assert "--partition=p5" in command


def test_the_server_may_take_longer_to_answer_on_trainium_and_submit_waits_for_it(monkeypatch):
    """vLLM on Neuron compiles the model when it starts: the server's start limit, and submit's wait for the
    endpoint, are longer on a Trainium partition by the same amount."""
    from llm_pipeline import vllm_server
    from llm_pipeline.jobs import serving_image

    monkeypatch.setenv("HPL_ACCELERATOR", "neuron")
    assert vllm_server.start_limit_s() == serving_image.NEURON_SERVER_START_S > serving_image.SERVER_START_S
    monkeypatch.setenv("HPL_ACCELERATOR", "cuda")
    assert vllm_server.start_limit_s() == serving_image.SERVER_START_S
    extra = serving_image.NEURON_SERVER_START_S - serving_image.SERVER_START_S
    assert serve_job.endpoint_wait_s({"HPL_ACCELERATOR": "neuron"}) == serve_job.ENDPOINT_WAIT_S + extra
    assert serve_job.endpoint_wait_s({"HPL_ACCELERATOR": "cuda"}) == serve_job.ENDPOINT_WAIT_S
