"""FSDP2 parity of torchtitan 0.2.2's own llama3 debug model: two gloo processes train like one.

torchtitan's Trainer needs CUDA, so torchtitan_fsdp_probe.py composes the trainer's parts on CPU
(train spec, init_weights, apply_fsdp, its loss normalization, clip_grad_norm_); see its docstring.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from torchtitan_site import site_env

pytestmark = pytest.mark.engine

PROBE = Path(__file__).with_name("torchtitan_fsdp_probe.py")
STEPS = 4


def train(world: int) -> dict:
    env = site_env()
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    out = subprocess.run([*command, str(PROBE), str(STEPS)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> tuple[dict, dict]:
    return train(1), train(2)


def test_two_ranks_shard_the_model(runs):
    one, two = runs
    assert one["sharded"] == 0 and two["sharded"] > 0  # every block's parameters split over 2 ranks


def test_two_ranks_lose_and_learn_like_one(runs):
    one, two = runs
    assert len(one["losses"]) == STEPS and one["losses"][0] != one["losses"][-1]  # it trains
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-4)
    assert one["weights"].keys() == two["weights"].keys()
    for name, (total, magnitude) in one["weights"].items():
        two_total, two_magnitude = two["weights"][name]
        assert two_magnitude == pytest.approx(magnitude, rel=1e-6), name
        assert abs(two_total - total) <= 1e-6 * magnitude, name  # signed sums cancel: scale by magnitude
