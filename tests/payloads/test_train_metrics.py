"""The MFU formula (training.metrics) on Llama 3 8B, worked by hand, and its parts checked against
the real model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llm_pipeline.training import metrics
from llm_pipeline.training.torch.watch import UtilisationMetrics

LLAMA3_8B = LlamaConfig(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    tie_word_embeddings=False,
)


def test_matmul_parameters_are_the_model_without_embedding_and_norms():
    # per layer: q, o 4096x4096; k, v 4096x1024; gate, up, down 4096x14336 -> 218,103,808; x 32;
    # plus lm_head 128256 x 4096
    assert metrics.matmul_parameters(LLAMA3_8B) == 32 * 218_103_808 + 525_336_576 == 7_504_658_432
    with torch.device("meta"):
        model = LlamaForCausalLM(LLAMA3_8B)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == metrics.matmul_parameters(LLAMA3_8B)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # "8B": + embedding + norms


def test_flops_per_token_full_and_adapter():
    attention = 12 * 32 * 1024 * 4096  # 1,610,612,736 at seq_len 1024
    assert metrics.flops_per_token(LLAMA3_8B, 1024, full=True) == 6 * 7_504_658_432 + attention == 46_638_563_328
    assert metrics.flops_per_token(LLAMA3_8B, 1024, full=False) == 4 * 7_504_658_432 + attention


def test_mfu_is_achieved_over_peak_flops():
    flops = metrics.flops_per_token(LLAMA3_8B, 1024, full=True)
    # 10,000 tokens/s on one H100 (989.4 TFLOP/s dense bf16): 46.64 GFLOP x 1e4 / 989.4e12 = 47.1 %
    assert metrics.mfu(10_000, flops, 1, 989.4e12) == pytest.approx(0.47138, abs=1e-5)
    # the same throughput spread over 8 devices is 8x less of their combined peak
    assert metrics.mfu(10_000, flops, 8, 989.4e12) == pytest.approx(0.47138 / 8, abs=1e-6)


def test_peak_comes_from_the_environment_or_the_device_table():
    assert metrics.device_peak_flops({"HPL_PEAK_TFLOPS": "312"}) == 312e12
    if not torch.cuda.is_available():
        assert metrics.device_peak_flops({}) is None  # a CPU has no entry: MFU is not reported


def test_mfu_counts_the_real_tokens_and_their_own_example_lengths():
    """Padding counts nothing and a packed row's tokens attend over their own example, not max_length."""
    from types import SimpleNamespace

    from llm_pipeline.training.callbacks import TokenCounter

    def pad_to(width):
        return lambda features: {
            "input_ids": torch.zeros(len(features), width, dtype=torch.long),
        }

    tokens = TokenCounter(pad_to(1024))
    callback = UtilisationMetrics(tokens=tokens, model_config=LLAMA3_8B, full=True, peak_flops=989.4e12)
    callback.on_train_begin(SimpleNamespace(world_size=1), None, None)
    callback.last_time = 0.0  # one second before the log below
    # one packed row of two examples (600 + 400 tokens) and one padded example of 200 tokens
    tokens([{"input_ids": [1] * 1000, "seq_lengths": [600, 400]}, {"input_ids": [1] * 200}])
    assert tokens.real == 1200 and tokens.total == 2048
    logs = {"loss": 1.0}
    callback._clock = lambda: 1.0
    callback.on_log(SimpleNamespace(world_size=1), None, None, logs=logs)
    mean_context = (600**2 + 400**2 + 200**2) / 1200  # 466.7, where max_length would say 1024
    expected = metrics.mfu(1200, metrics.flops_per_token(LLAMA3_8B, mean_context, full=True), 1, 989.4e12)
    assert logs["mfu"] == pytest.approx(expected)
    assert logs["mfu"] < metrics.mfu(1200, metrics.flops_per_token(LLAMA3_8B, 1024, full=True), 1, 989.4e12)
