"""The ladder's Hugging Face export: a torchtitan checkpoint in, a folder transformers loads out.

The checkpoint is saved as torchtitan's CheckpointManager saves a rung's last step (model only,
torch distributed checkpoint, step-N) from torchtitan 0.2.2's llama3 debug model; the export step
runs as on the cluster (python -m llm_pipeline.pretrain export); transformers' LlamaForCausalLM on
the exported folder must give torchtitan's logits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torchtitan_site import REPO, site_env

from llm_pipeline import config
from llm_pipeline.training.torchtitan import ladder

PROBE = Path(__file__).with_name("torchtitan_export_probe.py")
TINY_LADDER = REPO / "payloads" / "configs" / "tiny-ladder-cpu.toml"


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=REPO / "payloads")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def test_export_gives_a_transformers_model_with_torchtitans_logits(tmp_path):
    hpl = {name: str(tmp_path / name) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    env = site_env({**hpl, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    run_config = tmp_path / "ladder.toml"
    run_config.write_text(TINY_LADDER.read_text().replace("export_hf = false", "export_hf = true"))
    cfg = config.load(run_config, env=hpl)
    rung = cfg.torchtitan.rungs[-1]
    ladder.write_job_file(cfg, rung)
    checkpoints = ladder.rung_dir(cfg, rung) / "checkpoint"
    run([sys.executable, str(PROBE), "checkpoint", str(checkpoints / "step-20"), cfg.paths.model_dir], env)
    (checkpoints / "step-30").mkdir()  # an interrupted save (no .metadata): never exported

    step = run([sys.executable, "-m", "llm_pipeline.pretrain", "export", "--config", str(run_config)], env)
    hf_dir = Path(cfg.paths.output_dir) / "hf"
    assert f"exporting {checkpoints / 'step-20'}" in step.stdout and f"folder ready: {hf_dir}" in step.stdout
    assert not hf_dir.with_name("hf.tmp").exists()

    answer = json.loads(
        run([sys.executable, str(PROBE), "compare", str(checkpoints / "step-20"), str(hf_dir)], env).stdout
    )
    assert "config.json" in answer["hf_files"] and any(name.endswith(".safetensors") for name in answer["hf_files"])
    assert answer["max_abs_diff"] <= 1e-4 * max(1.0, answer["logit_scale"]), answer
