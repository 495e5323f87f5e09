"""One training example as the torch engine's trainer sees it: tokenized by trl, the trained span marked.

The record goes through the same path as training: backend.loss_records (prompt-completion pairs, or
chat records as they are), then trl's own SFTTrainer dataset preparation, which tokenizes, labels the
untrained tokens -100 and truncates to data.max_length. Nothing here masks tokens itself; it reads
trl's labels. Tokens labelled for training are shown between [[ and ]].
"""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

from llm_pipeline.config import RunConfig
from llm_pipeline.prompt import is_chat
from llm_pipeline.training.text_blocks import formatting_func
from llm_pipeline.training.torch.backend import completion_only, loss_records

IGNORED = -100  # the label trl gives a token that is not trained
OPEN, CLOSE = "[[", "]]"


def prepared_example(cfg: RunConfig, record_dataset, tokenizer) -> dict | None:
    """trl's prepared form (input_ids, labels) of a one-record dataset, with the engine's loss settings; None
    when trl drops the record (cut to data.max_length, no trained token is left)."""
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    chat = is_chat(record_dataset.column_names)
    with tempfile.TemporaryDirectory() as scratch:
        args = SFTConfig(
            output_dir=scratch,
            max_length=cfg.data.max_length,
            completion_only_loss=completion_only(cfg),
            assistant_only_loss=chat and completion_only(cfg),
            report_to="none",
            bf16=False,
            dataset_num_proc=None,
        )
    # The trainer's state its dataset preparation reads, set as SFTTrainer.__init__ sets it (without a model).
    swap_template = args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template)
    trainer_state = SimpleNamespace(
        _tokenizer=tokenizer,
        chat_template=get_training_chat_template(tokenizer) if swap_template else None,
        completion_only_loss=args.completion_only_loss,
        padding_free=False,
    )
    records = loss_records(cfg, record_dataset)
    text_format = None if completion_only(cfg) or chat else formatting_func(cfg)
    prepared = SFTTrainer._prepare_dataset(trainer_state, records, tokenizer, args, False, text_format, "preview")
    return prepared[0] if len(prepared) else None


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
