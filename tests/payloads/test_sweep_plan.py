"""The sweep's points for the shipped full fine-tuning configs at 1, 2 and 4 nodes: the reference
hyperparameters carried over, the global batch held at 256, and no checkpoint at any point."""

from __future__ import annotations

import pytest
from payload_configs import CONFIGS

from llm_pipeline import config
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.jobs.sweep_plan import plan_sweep, read_base, training_summary


@pytest.mark.parametrize("name", ["llama2-7b-full.toml", "llama3-8b-full.toml"])
def test_full_config_points_keep_the_reference_setup(tmp_path, name):
    points = plan_sweep(
        read_run_facts(CONFIGS / name, {}), "neuron", tmp_path / "sweep", [1, 2, 4], steps=40, logging_steps=5
    )
    assert [(p.nodes, p.gradient_accumulation_steps, p.global_batch) for p in points] == [
        (1, 64, 256), (2, 32, 256), (4, 16, 256),
    ]  # fmt: skip
    for point in points:
        derived = config.load(point.config, env={})  # the point's config is a valid run config
        train = derived.train
        assert (train.learning_rate, train.lr_scheduler, train.min_learning_rate) == (3e-4, "cosine_with_min_lr", 3e-5)
        assert (train.adam_beta1, train.adam_beta2, train.weight_decay) == (0.9, 0.95, 0.1)
        assert train.bf16 and not train.fp32_master_weights and train.gradient_checkpointing
        assert not train.save_checkpoints and train.max_steps == 40  # a throughput run saves nothing
        assert derived.parallel.nodes == point.nodes and derived.data.max_length == 4096 and derived.data.blocks
        config.check_backend(derived, "neuron")  # global_batch_size 256 stated and met at every node count
        summary = training_summary(derived)
        assert "AdamW lr 0.0003 cosine_with_min_lr to 3e-05" in summary and "betas 0.9/0.95" in summary
        assert "weight decay 0.1" in summary and "no fp32 master weights" in summary
        assert summary.endswith("checkpoints: none")


def test_the_base_facts_name_the_model_for_the_report(tmp_path):
    assert read_base(config.load(CONFIGS / "llama2-7b-full.toml", env={}), "neuron").model_id == (
        "meta-llama/Llama-2-7b-hf"
    )
    assert read_base(config.load(CONFIGS / "default.toml", env={}), "neuron").model_id == "meta-llama/Meta-Llama-3-8B"


def test_the_base_config_keeps_its_checkpoints():
    assert "every 100 steps and at the end" in training_summary(config.load(CONFIGS / "llama2-7b-full.toml", env={}))


def test_dry_run_of_the_llama2_full_config_at_1_2_4_nodes(tmp_path, monkeypatch, capsys):
    """What a user sees before submitting: every point at global batch 256 with the reference optimizer,
    bf16 with stochastic rounding, and no checkpoint."""
    from llm_pipeline import sweep

    monkeypatch.setenv("HPL_OUTPUTS_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("HPL_MODELS_DIR", str(tmp_path / "models"))
    assert sweep.main(["--config", str(CONFIGS / "llama2-7b-full.toml"), "--nodes", "1,2,4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for nodes, accumulation in ((1, 64), (2, 32), (4, 16)):
        assert f"{nodes} node(s): gradient accumulation {accumulation}, global batch 256" in out
    assert out.count("AdamW lr 0.0003 cosine_with_min_lr to 3e-05") == 3 and out.count("checkpoints: none") == 3
    assert out.count("betas 0.9/0.95, weight decay 0.1") == 3 and "no fp32 master weights" in out
    assert "# dry run: nothing submitted" in out
