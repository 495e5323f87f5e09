"""Packed examples do not attend to each other (docs/training.md's claim for `data.packing`).

trl 0.24 packs with best-fit-decreasing in padding-free mode: its collator flattens a batch into one row
with position ids restarting at each example and no attention mask. This runs that collator's output
through a real tiny Llama in bf16 (the GPU default) with sdpa (the engine's attention where flash-attn
is absent) and eager, with `use_cache=False` as trl's SFTTrainer.compute_loss passes it (transformers
4.57 builds the per-example mask from the position ids only when no cache is in play), and checks that
every example's logits equal those of the example run alone.
"""

from __future__ import annotations

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from tools.tiny_model import build_llama


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_each_packed_example_sees_only_itself(attention):
    model = build_llama(256, seed=3).to(torch.bfloat16).train()  # dropout is 0 in the tiny Llama
    model.config._attn_implementation = attention
    examples = [[5, 17, 99, 3, 42, 8, 11], [7, 7, 120, 64], [200, 1, 2, 3, 4, 5, 6, 9, 10]]
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collator([{"input_ids": ids} for ids in examples])
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, sum(map(len, examples)))
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        start = 0
        for ids in examples:
            alone = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            torch.testing.assert_close(packed[start : start + len(ids)], alone, rtol=0, atol=0.05)
            start += len(ids)
        # Without the position ids the same row is one causal sequence: later examples see earlier ones.
        mixed = model(input_ids=batch["input_ids"], use_cache=False).logits[0]
    second = slice(len(examples[0]), len(examples[0]) + len(examples[1]))
    assert (mixed[second] - packed[second]).abs().max() > 0.1
