"""The ladder's Hugging Face export: a rung's torchtitan checkpoint in, a folder transformers loads out.

The checkpoint is the default last rung's (fp8_allgather), saved by torchtitan 0.2.2's own
CheckpointManager at the rung's last step after training its llama3 debug model with float8 linears
and the float8 FSDP all-gather under FSDP2 on two gloo processes: the rehearsal's trainer,
tools/torchtitan_standin.py, which composes torchtitan's parts on CPU (torchao's float8 emulation,
as no GPU is here). The export step runs as on the cluster
(python -m llm_pipeline.pretrain export); transformers' LlamaForCausalLM on the exported folder must
give the logits of torchtitan's model holding that checkpoint (both compute in float32 from the same
bf16 weights, the production export_dtype).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from torchtitan_site import REPO, site_env

from llm_pipeline import config
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.training.torchtitan import ladder

pytestmark = pytest.mark.engine

PROBES = Path(__file__).parent
TINY_LADDER = REPO / "payloads" / "configs" / "tiny-ladder-cpu.toml"
STEPS = 2
# What the tokenizer step puts beside the tokenizer for the 8B ladder: Llama-3.1-8B's config, whose
# shape is not the debug flavor's; the export must describe the checkpoint, keeping the token ids.
ASSET_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "bos_token_id": 128000}


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=REPO / "payloads")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def test_fp8_allgather_checkpoint_exports_to_a_transformers_model_with_torchtitans_logits(tmp_path):
    hpl = {name: str(tmp_path / name) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    env = site_env({**hpl, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    run_config = tmp_path / "ladder.toml"
    # the 8B base's final save: the model alone, in bf16 (the debug base's is float32)
    overrides = ["training.local_batch_size = 2", 'checkpoint.export_dtype = "bfloat16"']
    write_derived(TINY_LADDER, run_config, {("torchtitan", "steps"): STEPS, ("torchtitan", "overrides"): overrides})
    cfg = config.load(run_config, env=hpl)
    rung = cfg.torchtitan.rungs[-1]
    assert rung == "fp8_allgather"
    job_file = ladder.write_job_file(cfg, rung)
    assets = Path(cfg.paths.model_dir)
    assets.mkdir(parents=True)
    (assets / "config.json").write_text(json.dumps(ASSET_CONFIG))
    (assets / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    trained = run([*torchrun, "-m", "tools.torchtitan_standin", "--job.config_file", str(job_file)], env)
    assert "Swapped to Float8Linear layers with enable_fsdp_float8_all_gather=True" in trained.stdout + trained.stderr
    checkpoints = ladder.rung_dir(cfg, rung) / "checkpoint"
    saved = checkpoints / f"step-{STEPS}"
    assert (saved / ".metadata").is_file()
    pickled = b"".join(path.read_bytes() for path in saved.glob("*.distcp"))
    assert b"WeightWithDynamicFloat8CastTensor" in pickled  # torchao's class, what broke the loader
    (checkpoints / "step-30").mkdir()  # an interrupted save (no .metadata): never exported

    step = run([sys.executable, "-m", "llm_pipeline.pretrain", "export", "--config", str(run_config)], env)
    hf_dir = Path(cfg.paths.output_dir) / "hf"
    assert f"exporting {checkpoints / f'step-{STEPS}'}" in step.stdout and f"folder ready: {hf_dir}" in step.stdout
    assert "config.json: hidden_size 4096 -> 256 (the checkpoint's flavor)" in step.stdout
    assert not hf_dir.with_name("hf.tmp").exists() and not (hf_dir / "sharded").exists()
    exported = json.loads((hf_dir / "config.json").read_text())
    assert (exported["hidden_size"], exported["num_hidden_layers"], exported["vocab_size"]) == (256, 6, 2048)
    assert exported["bos_token_id"] == 128000 and exported["torch_dtype"] == "bfloat16"  # export_dtype
    assert (hf_dir / "chat_template.jinja").read_text() == (assets / "chat_template.jinja").read_text()

    compare = PROBES / "torchtitan_export_probe.py"
    answer = json.loads(run([sys.executable, str(compare), "compare", str(saved), str(hf_dir)], env).stdout)
    assert answer["max_abs_diff"] <= 1e-4 * max(1.0, answer["logit_scale"]), answer
    assert any(name.endswith(".safetensors") for name in answer["hf_files"])
