"""Full fine-tuning loads the model once, and prepare refuses what a node's memory cannot hold.

Measured: two gloo ranks (torchrun) load a ~300 MB (fp32) Llama stored in bf16 through the engine's own
load: full fine-tuning under FSDP (rank 0 reads it, rank 1 allocates without reading or writing), and
under DDP (every rank reads it). Each reading rank's peak resident memory grows by about the model,
the waiting rank's by almost nothing. The rule that sizes a node's load (training.full_rules) refuses
the 8B full fine-tuning config's shape on a trn2.48xlarge when every rank loads, and passes it loaded
once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_launch import engine_env
from payload_configs import CONFIGS, folder_env, write_config
from test_neuron_full import LLAMA3_8B

from llm_pipeline import config
from llm_pipeline.errors import StepError
from llm_pipeline.training import full_rules
from llm_pipeline.training.torch import parallel
from stacks.accelerators import INSTANCE_TYPES
from tools import tiny_model as tiny

pytestmark = [pytest.mark.engine]
PROBE = Path(__file__).with_name("load_memory_probe.py")
RANKS = 2


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_datasets_dir) -> dict[str, list[dict]]:
    """strategy -> each rank's record, for full fine-tuning loaded by FSDP (once) and by DDP (every rank)."""
    folder = tmp_path_factory.mktemp("load-memory")
    # bf16 on disk, as the download step saves it; full fine-tuning loads fp32 masters, so each loading rank
    # converts into its own memory (an fp32 file would stay shared, mapped pages of the page cache)
    model_dir = folder / "models" / "tiny-llama"
    tiny.write_tiny_model(model_dir, dtype="bfloat16", hidden=1024, layers=8, heads=4, kv_heads=2)
    env = folder_env(folder / "outputs", folder / "models", tiny_datasets_dir)
    answer = {}
    for strategy in ("fsdp", "ddp"):
        run = write_config(folder / f"{strategy}.toml", env, train={"method": "full"}, parallel={"strategy": strategy})
        out = folder / strategy
        out.mkdir()
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
        command = [*launch, str(PROBE), "--config", str(run), "--out", str(out)]
        done = subprocess.run(command, env=engine_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        answer[strategy] = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])
    return answer


def test_every_rank_loads_a_copy_without_fsdp(measured):
    ranks = measured["ddp"]
    model = ranks[0]["model"]
    assert model > 250e6
    assert all(r["peak_growth"] > 0.8 * model for r in ranks), ranks


def test_full_fine_tuning_under_fsdp_loads_once_a_node(measured):
    first, second = measured["fsdp"]
    model = first["model"]
    assert first["peak_growth"] > 0.8 * model
    assert second["peak_growth"] < 0.2 * model, second
    every = sum(r["peak_growth"] for r in measured["ddp"])
    once = first["peak_growth"] + second["peak_growth"]
    assert once < 0.65 * every
    print(
        f"peak RSS growth at load, {RANKS} ranks, {model / 1e6:.0f} MB model: every rank {every / 1e6:.0f} MB, "
        f"once {once / 1e6:.0f} MB"
    )


def test_the_8b_full_fine_tuning_shape_fits_a_trn2_node_only_loaded_once():
    cfg = config.load(CONFIGS / "llama3-8b-full-trn2.toml", env={"HPL_MODELS_DIR": "/m", "HPL_OUTPUTS_DIR": "/o"})
    ranks = cfg.parallel.devices_per_node
    node = INSTANCE_TYPES["ml.trn2.48xlarge"]
    assert (ranks, node.host_memory_gib) == (node.devices, 2048)
    shape = dict(ranks=ranks, load_bytes=4, host_memory_gib=node.host_memory_gib)  # fp32 masters
    with pytest.raises(StepError, match=r"64 copies \(every rank\) of 29\.9 GiB: ~2,043 GiB .* does not fit"):
        full_rules.check_host_memory(LLAMA3_8B, loads_once=False, **shape)
    assert parallel.loads_once(cfg, ranks)  # the engine's own choice for this config
    line = full_rules.check_host_memory(LLAMA3_8B, loads_once=True, **shape)
    assert "one copy" in line and "~158 GiB" in line
