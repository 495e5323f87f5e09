"""Fixed-length batches for Neuron: padding is masked out of the attention and out of the loss.

The Neuron graphs are compiled for one input shape, so every batch must be exactly
data.max_length wide. optimum-neuron 0.4.5's default collator gets that width by appending the pad
id (EOS on Llama 3) to ``input_ids`` before trl's collator runs, and trl then labels every position
and sets the attention mask to ones: the loss is mostly padding. This collator lets trl pad instead
(labels -100, attention mask 0) and only fixes the width: examples are cut to max_length and the
batch is padded up to it.

Completion-only loss (data.completion_only_loss): trl 0.24 (the trn1 image) tokenizes prompt-completion
records into ``input_ids`` and a ``completion_mask`` and labels the prompt -100 in its collator, when
told so (``completion_only_loss``); trl 1.x labels the prompt -100 while preparing the dataset
(a ``labels`` column, which this collator cuts with the rest) and its collator has no such switch.
"""

from __future__ import annotations

from typing import Any

from llm_pipeline.errors import StepError


class FixedLengthCollator:
    """trl's language-modeling collator, with every batch exactly ``max_length`` tokens wide."""

    def __init__(self, *, pad_token_id: int, max_length: int, completion_only_loss: bool = False):
        import dataclasses

        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.max_length = max_length
        # trl 0.24 masks the prompt here when told (and only then: its default is True); on trl 1.x the
        # prepared labels already carry the mask (module docstring).
        fields = {field.name for field in dataclasses.fields(DataCollatorForLanguageModeling)}
        own_masking = {"completion_only_loss": completion_only_loss} if "completion_only_loss" in fields else {}
        # Padding to a multiple of max_length, after cutting to max_length, is padding to max_length.
        self.collator = DataCollatorForLanguageModeling(
            pad_token_id=pad_token_id, pad_to_multiple_of=max_length, **own_masking
        )

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        cut = [
            {key: value[: self.max_length] if isinstance(value, list) else value for key, value in example.items()}
            for example in examples
        ]
        return self.collator(cut)


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id (Llama 3 has no pad token), as optimum-neuron picks it."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise StepError(
            f"the tokenizer ({type(tokenizer).__name__}) has neither a pad token nor an EOS token: "
            "use a model folder with a complete tokenizer"
        )
    return int(pad)
