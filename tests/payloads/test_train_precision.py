"""The torch engine's precision policy under the production defaults, with the GPU lane's pins
(engine_launch.py): bf16 on, every method, FSDP2 on 2 gloo ranks against one process with the same
global batch. Trainable weights are fp32 masters (the full run's lr 2e-5 updates would round away
in bf16 weights), the loss the trainer sees is fp32, and a QLoRA run leaves its packed 4-bit base
bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_launch import run_engine
from payload_configs import folder_env, write_config

from llm_pipeline import config, data

# One launch per rank count serves every test here.
pytestmark = [pytest.mark.xdist_group("torch_engine"), pytest.mark.engine]
METHODS = ("lora", "dora", "qlora", "full")
STEPS = 4
GLOBAL_BATCH = 4
# bf16 compute: losses of differently reduced but equal batches agree to bf16's relative precision
BF16_RTOL = 2**-7


def write_run(folder: Path, env: dict[str, str], method: str, ranks: int) -> Path:
    """tiny-cpu.toml with the production precision, ``ranks`` FSDP2 ranks and the same global batch."""
    path = write_config(
        folder / f"{method}-{ranks}.toml",
        env,
        train={
            "method": method,
            "bf16": True,
            "max_steps": STEPS,
            "logging_steps": 1,
            "per_device_batch_size": GLOBAL_BATCH // ranks,
            # full fine-tuning at the default learning rate: most bf16 weights would not move
            "learning_rate": 2e-5 if method == "full" else 5e-3,
        },
        data={"validation_fraction": 0.0, "max_samples": 48},
        paths={"output_dir": str(folder / f"{method}-{ranks}")},
        parallel={"strategy": "fsdp", "nodes": ranks},
    )
    data.prepare(config.load(path, env=env))  # several ranks need the data step first
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_models_dir, tiny_datasets_dir) -> dict[int, dict[str, dict]]:
    """ranks -> method -> what the probe measured, for 1 process and 2 FSDP2 ranks."""
    folder = tmp_path_factory.mktemp("precision")
    env = folder_env(folder, tiny_models_dir, tiny_datasets_dir)
    answer = {}
    for ranks in (1, 2):
        runs = [write_run(folder, env, method, ranks) for method in METHODS]
        measured = run_engine(runs, folder / f"ranks-{ranks}.json", ranks=ranks)
        answer[ranks] = {stem.rsplit("-", 1)[0]: value for stem, value in measured.items()}
    return answer


@pytest.mark.parametrize("method", METHODS)
def test_fsdp2_trains_like_one_process_in_bf16(results, method):
    one, two = results[1][method], results[2][method]
    assert len(two["losses"]) == STEPS and two["losses"][-1] < two["losses"][0]
    assert two["losses"] == pytest.approx(one["losses"], rel=BF16_RTOL)
    # fp32 masters: small updates land, and both strategies move the same weights
    assert two["changed_fraction"] == pytest.approx(one["changed_fraction"], abs=0.01)
    assert two["changed_fraction"] > 0.95


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("method", METHODS)
def test_trainable_weights_and_the_loss_are_fp32(results, method, ranks):
    run = results[ranks][method]
    assert run["trainable_dtypes"] == ["float32"]
    assert run["loss_dtypes"] == ["float32"]  # FSDP2 returns fp32 outputs; one process autocasts to fp32 loss
    frozen = {name: count for name, count in run["parameter_dtypes"].items() if name != "float32"}
    # frozen weights stay in the compute dtype (or 4-bit): full fine-tuning has none
    assert (frozen == {}) == (method == "full")
    assert set(frozen) <= {"bfloat16", "nf4"}


@pytest.mark.parametrize("ranks", [1, 2])
def test_qlora_packed_base_is_bit_identical_after_training(results, ranks):
    run = results[ranks]["qlora"]
    assert run["packed_words"] == run["parameter_dtypes"]["nf4"] > 0
    assert run["packed_words_changed"] == 0
