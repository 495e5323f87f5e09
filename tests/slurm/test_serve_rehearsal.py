"""`hpctl serve`'s job on the local Slurm: slurm/serve.sbatch serves a tiny tuned model (a Llama with head size 32,
the CPU backend's smallest, and a LoRA adapter made with peft) with vLLM's CPU build, submitted and stopped by the
controller side of `hpctl serve` (llm_pipeline.jobs.serve_job). One server start for the module: vLLM takes minutes
to start here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llm_pipeline.jobs import serve_job
from llm_pipeline.run_files import PIPELINE_FILE, PipelineRecord
from llm_pipeline.serve import BASE_NAME, TUNED_NAME
from tests.vllm_site import site_python
from tools import tiny_model as tiny

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-serve_rehearsal")]
REPO = Path(__file__).resolve().parents[2]
PROMPT = "### Instruction\nName a colour.\n\n### Answer\n"


def write_adapter(base: Path, out: Path) -> Path:
    """A LoRA adapter over ``base`` whose B matrices are not zero, so the tuned model answers differently."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out)
    return out


def complete(endpoint: str, model: str) -> dict:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1}).encode()
    request = urllib.request.Request(
        f"http://{endpoint}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())["choices"][0]


def serve_job_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llm_pipeline.jobs.serve_job", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "payloads", timeout=1500)


def squeue(env: dict[str, str], job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip()


def test_the_serve_job_answers_with_the_adapter_then_stop_leaves_nothing_running(one_node, tmp_path):
    vllm_python = site_python()
    base = tiny.write_tiny_model(tmp_path / "tiny-llama", **tiny.SERVABLE_SHAPE)
    run_dir = tmp_path / "outputs" / "serve-run"
    write_adapter(base, run_dir / "adapter")
    config = tmp_path / "run.toml"
    config.write_text(
        f'[model]\ndtype = "float32"\n[paths]\nmodel_dir = "{base}"\noutput_dir = "{run_dir}"\n'
        "[benchmark]\nmax_model_len = 256\n"
    )
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / PIPELINE_FILE).write_text(PipelineRecord(config=str(config), steps=()).to_json())
    env = one_node.env(
        {
            **os.environ,
            "HPL_ACCELERATOR": "none",  # a CPU partition, as the rehearsal's (no deploy facts on the local Slurm)
            "PYTHON": sys.executable,
            "HPL_VLLM_PYTHON": str(vllm_python),
            "PYTHONPATH": str(REPO / "payloads"),
        }
    )

    started = serve_job_cli(env, "submit", "--run-dir", str(run_dir), "--hours", "0.5")
    logs = [*(run_dir / "logs").glob("serve-*.log"), *(run_dir / "serve").glob("*.log")]
    errors = "\n".join(line for log in logs for line in log.read_text().splitlines() if "rror" in line)
    assert started.returncode == 0, started.stdout + started.stderr + errors
    (line,) = [line for line in started.stdout.splitlines() if line.startswith(serve_job.ENDPOINT_LINE)]
    endpoint, job = line.removeprefix(serve_job.ENDPOINT_LINE).split()
    assert (run_dir / "serve" / serve_job.ENDPOINT_FILE).read_text().strip() == endpoint
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    assert "TimeLimit=00:30:00" in shown and f"Partition={one_node.name}" in shown and "Comment=serve-run" in shown

    tuned, plain = complete(endpoint, TUNED_NAME), complete(endpoint, BASE_NAME)
    assert tuned["text"] and len(tuned["logprobs"]["tokens"]) == 6
    # the adapter is applied: the same prompt, greedy, scores differently through it
    assert tuned["logprobs"]["token_logprobs"] != plain["logprobs"]["token_logprobs"]

    # a second server for the same run is refused while this one runs
    again = serve_job_cli(env, "submit", "--run-dir", str(run_dir))
    assert again.returncode == 2 and f"already served by job {job}: stop it first" in again.stderr

    stopped = serve_job_cli(env, "stop", "--run-dir", str(run_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert f"cancelled serve job {job}" in stopped.stdout
    assert squeue(env, job) == ""
    host, port = endpoint.rsplit(":", 1)
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=5):
        pass
    assert not (run_dir / "serve" / serve_job.ENDPOINT_FILE).exists()
    gone = serve_job_cli(env, "stop", "--run-dir", str(run_dir))
    assert gone.returncode == 2 and "has no serve job running" in gone.stderr
