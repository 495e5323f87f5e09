"""One training example as the torch engine's trainer sees it: tokenized by trl, the trained span marked.

The record goes through the same path as training: backend.loss_records (prompt-completion pairs, or
chat records as they are), then trl's own SFTTrainer dataset preparation, which tokenizes, labels the
untrained tokens -100 and truncates to data.max_length. Nothing here masks tokens itself; it reads
trl's labels. Tokens labelled for training are shown between [[ and ]].
"""

from __future__ import annotations

from llm_pipeline.config import RunConfig
from llm_pipeline.training.trained_tokens import IGNORED, prepared_records

OPEN, CLOSE = "[[", "]]"


def prepared_example(cfg: RunConfig, record_dataset, tokenizer) -> dict | None:
    """trl's prepared form (input_ids, labels) of a one-record dataset, with the engine's loss settings; None
    when trl drops the record (cut to data.max_length, no trained token is left)."""
    prepared = prepared_records(cfg, record_dataset, tokenizer)
    return prepared[0] if prepared else None


def trained_spans(input_ids: list[int], labels: list[int]) -> list[tuple[list[int], bool]]:
    """Runs of consecutive tokens, each with whether it is trained."""
    spans: list[tuple[list[int], bool]] = []
    for token, label in zip(input_ids, labels, strict=True):
        trained = label != IGNORED
        if spans and spans[-1][1] == trained:
            spans[-1][0].append(token)
        else:
            spans.append(([token], trained))
    return spans


def marked_text(example: dict, tokenizer) -> str:
    """The decoded example with each trained span between [[ and ]] (special tokens shown as they are)."""
    parts = []
    for tokens, trained in trained_spans(example["input_ids"], example["labels"]):
        text = tokenizer.decode(tokens)
        parts.append(f"{OPEN}{text}{CLOSE}" if trained else text)
    return "".join(parts)


def describe(example: dict | None, tokenizer, max_length: int) -> str:
    if example is None:
        return f"the trainer drops this record: cut to data.max_length {max_length}, no trained token is left"
    trained = sum(label != IGNORED for label in example["labels"])
    return "\n".join(
        [
            f"{len(example['input_ids'])} tokens, {trained} trained (marked with double square brackets):",
            marked_text(example, tokenizer),
        ]
    )
