"""DPO parity gate: the engine's per-step DPO loss (train.objective dpo, LoRA, fp32, one process) equals plain trl
DPOTrainer's on the same tiny model, pairs, LoRA config and seed; a run with another dpo.beta does not.

Both read the same prompt/chosen/rejected JSONL; the plain run is trl as its docs use it (DPOConfig, DPOTrainer,
peft LoraConfig, the adapter-disabled reference), with the run config's numbers typed in. On CPU in fp32 the two
take the same operations, so the tolerance is float noise (measured: 6.0e-7 relative at most over the 4 steps)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from payload_configs import TINY_TOML, write_config

from llm_pipeline import train
from llm_pipeline.run_metrics import read_run
from tools import tiny_model as tiny

pytestmark = pytest.mark.engine

STEPS, BATCH, LEARNING_RATE, SEED, BETA = 4, 4, 5e-3, 42, 0.1
TOLERANCE = 1e-5  # relative, per step


def _pairs_file(folder):
    records = [
        {"prompt": r["instruction"] + "\n", "chosen": r["chosen"], "rejected": r["rejected"]}
        for r in tiny.preference_records(24)
    ]
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _engine_losses(folder, models, pairs, name: str, beta: float) -> list[float]:
    env = {"HPL_MODELS_DIR": str(models), "HPL_DATASETS_DIR": str(folder), "HPL_OUTPUTS_DIR": str(folder / name)}
    path = write_config(
        folder / f"{name}.toml",
        env,
        data={"dataset": str(pairs), "packing": False, "validation_fraction": 0.0},
        train={
            "objective": "dpo",
            "method": "lora",
            "max_steps": STEPS,
            "save_steps": 100,
            "logging_steps": 1,
            "learning_rate": LEARNING_RATE,
            "per_device_batch_size": BATCH,
            "seed": SEED,
            "bf16": False,
        },
        dpo={"beta": beta},
    )
    with contextlib.redirect_stdout(io.StringIO()):
        assert train.main(["--prepare-data", "--config", str(path)]) == 0
    return list(read_run(folder / name / "tiny-lora")[0].losses)


def _plain_trl_losses(folder, models, pairs) -> list[float]:
    import datasets
    import tomllib
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    lora = tomllib.loads(TINY_TOML.read_text())["lora"]
    losses = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    model_dir = str(models / "tiny-llama")
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32"),
        args=DPOConfig(
            output_dir=str(folder / "plain"),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            learning_rate=LEARNING_RATE,
            seed=SEED,
            beta=BETA,
            bf16=False,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            max_length=128,
            lr_scheduler_type="linear",
            warmup_steps=0,
            weight_decay=0.0,
            activation_checkpointing=False,
            disable_tqdm=True,
        ),
        train_dataset=datasets.load_dataset("json", data_files=str(pairs), split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            bias="none",
            task_type="CAUSAL_LM",
        ),
        callbacks=[Record()],
    )
    trainer.train()
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_models_dir):
    folder = tmp_path_factory.mktemp("dpo-parity")
    pairs = _pairs_file(folder)
    return {
        "engine": _engine_losses(folder, tiny_models_dir, pairs, "engine", BETA),
        "beta-x5": _engine_losses(folder, tiny_models_dir, pairs, "beta-x5", 5 * BETA),
        "trl": _plain_trl_losses(folder, tiny_models_dir, pairs),
    }


def _largest_relative_difference(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == STEPS
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_the_engines_dpo_loss_equals_plain_trl_step_by_step(runs):
    assert _largest_relative_difference(runs["engine"], runs["trl"]) < TOLERANCE, runs


def test_another_beta_does_not_match(runs):
    assert _largest_relative_difference(runs["beta-x5"], runs["trl"]) > 100 * TOLERANCE, runs
