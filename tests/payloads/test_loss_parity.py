"""Loss parity gate: the tiny config trained by the torch backend in fp32 and in bf16 gives curves
that `compare` says match over the first steps, and a run with a perturbed learning rate does not.

The tolerance is the largest max relative loss difference that still matches. Measured on this
CPU engine (fp32 master weights, bf16 compute, fp32 loss) over the first 6 steps: bf16 vs fp32
0.01 %, learning rate x2 0.77 %, x3 2.49 %; 0.5 % keeps a margin on both sides. The tiny random
model's loss stays near ln(vocabulary), so every difference is small in relative terms. (The
1-process vs 2 FSDP2 ranks gate uses the same tolerance: tests/slurm/test_fsdp_train.py.)"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from payload_configs import write_config

from llm_pipeline import compare, train

pytestmark = pytest.mark.engine

PARITY_TOLERANCE = 0.005
PARITY_STEPS = 6
LEARNING_RATE = 5e-3


def _train(folder, hpl_base, name: str, **changes):
    env = dict(hpl_base, HPL_OUTPUTS_DIR=str(folder / name))
    train_keys = {"max_steps": PARITY_STEPS, "save_steps": 100, "logging_steps": 1, "learning_rate": LEARNING_RATE}
    path = write_config(folder / f"{name}.toml", env, data={"validation_fraction": 0.0}, train=train_keys | changes)
    with contextlib.redirect_stdout(io.StringIO()):
        assert train.main(["--prepare-data", "--config", str(path)]) == 0
    return folder / name / "tiny-lora"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_models_dir, tiny_datasets_dir):
    folder = tmp_path_factory.mktemp("parity")
    base = {"HPL_MODELS_DIR": str(tiny_models_dir), "HPL_DATASETS_DIR": str(tiny_datasets_dir)}
    return {
        "fp32": _train(folder, base, "fp32", bf16=False),
        "bf16": _train(folder, base, "bf16", bf16=True),
        "lr-x3": _train(folder, base, "lr-x3", bf16=False, learning_rate=3 * LEARNING_RATE),
    }


def _compare(runs, names, out) -> tuple[int, dict]:
    args = [str(runs[n]) for n in names] + ["--labels", ",".join(names), "--output", str(out)]
    code = compare.main([*args, "--steps", str(PARITY_STEPS), "--tolerance", str(PARITY_TOLERANCE)])
    return code, {row["label"]: row for row in json.loads((out / "compare.json").read_text())["runs"]}


def test_bf16_matches_fp32_over_the_first_steps(runs, tmp_path):
    code, rows = _compare(runs, ["fp32", "bf16"], tmp_path)
    assert rows["bf16"]["points_compared"] == PARITY_STEPS
    assert code == 0 and rows["bf16"]["matches"], rows["bf16"]
    assert (tmp_path / "compare.png").is_file() and "Verdict: **match**" in (tmp_path / "compare.md").read_text()


def test_a_perturbed_learning_rate_fails_the_tolerance(runs, tmp_path):
    code, rows = _compare(runs, ["fp32", "bf16", "lr-x3"], tmp_path)
    assert code == 1 and rows["bf16"]["matches"] and not rows["lr-x3"]["matches"]
    assert rows["lr-x3"]["max_relative_difference"] > 2 * PARITY_TOLERANCE
