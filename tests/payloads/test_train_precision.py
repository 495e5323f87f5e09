"""The torch engine's precision policy under the production defaults, with the GPU lane's pins
(engine_launch.py): bf16 on, every method, FSDP2 on 2 gloo ranks against one process with the same
global batch. Trainable weights are fp32 masters (the full run's lr 2e-5 updates would round away
in bf16 weights), the loss the trainer sees is fp32, and a QLoRA run leaves its packed 4-bit base
bit-identical."""

from __future__ import annotations

import pytest
from engine_launch import PRECISION_METHODS as METHODS
from engine_launch import PRECISION_STEPS as STEPS

# One launch per rank count serves every test here (the precision_runs fixture, tests/payloads/conftest.py), and
# test_liger_fsdp.py's runs without liger.
pytestmark = [pytest.mark.xdist_group("torch_engine"), pytest.mark.engine]
# bf16 compute: losses of differently reduced but equal batches agree to bf16's relative precision
BF16_RTOL = 2**-7


@pytest.mark.parametrize("method", METHODS)
def test_fsdp2_trains_like_one_process_in_bf16(precision_runs, method):
    one, two = precision_runs[1][method], precision_runs[2][method]
    assert len(two["losses"]) == STEPS and two["losses"][-1] < two["losses"][0]
    assert two["losses"] == pytest.approx(one["losses"], rel=BF16_RTOL)
    # fp32 masters: small updates land, and both strategies move the same weights
    assert two["changed_fraction"] == pytest.approx(one["changed_fraction"], abs=0.01)
    assert two["changed_fraction"] > 0.95


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("method", METHODS)
def test_trainable_weights_and_the_loss_are_fp32(precision_runs, method, ranks):
    run = precision_runs[ranks][method]
    assert run["trainable_dtypes"] == ["float32"]
    assert run["loss_dtypes"] == ["float32"]  # FSDP2 returns fp32 outputs; one process autocasts to fp32 loss
    frozen = {name: count for name, count in run["parameter_dtypes"].items() if name != "float32"}
    # frozen weights stay in the compute dtype (or 4-bit): full fine-tuning has none
    assert (frozen == {}) == (method == "full")
    assert set(frozen) <= {"bfloat16", "nf4"}


@pytest.mark.parametrize("ranks", [1, 2])
def test_qlora_packed_base_is_bit_identical_after_training(precision_runs, ranks):
    run = precision_runs[ranks]["qlora"]
    assert run["packed_words"] == run["parameter_dtypes"]["nf4"] > 0
    assert run["packed_words_changed"] == 0
