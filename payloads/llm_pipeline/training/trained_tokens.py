"""Which tokens of a record training computes its loss on, read from trl's own dataset preparation.

The records go through what the trainers (trl's SFTTrainer, optimum-neuron's NeuronSFTTrainer on trl 0.24)
train on: plan.loss_records (prompt-completion pairs, or chat records as they are), then trl's
SFTTrainer._prepare_dataset with the run's loss settings, which tokenizes and truncates to data.max_length.
trl 1.x returns the labels (-100 where not trained); trl 0.24 returns completion and assistant masks that its
collator turns into labels, which ``with_labels`` does the same way. Nothing here decides what is trained.
Used by `data --preview` and by evaluate (its validation loss is the training objective).
"""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

from llm_pipeline.config import RunConfig
from llm_pipeline.prompt import is_chat
from llm_pipeline.training.plan import completion_only, loss_records
from llm_pipeline.training.text_blocks import formatting_func

IGNORED = -100  # the label trl gives a token that is not trained


def training_chat_template(tokenizer, assistant_only: bool) -> str | None:
    """trl 1.x swaps in a chat template with generation markers when the tokenizer's has none (as
    SFTTrainer.__init__ does); trl 0.24 has no such swap (None: the tokenizer's own)."""
    try:
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers
    except ImportError:  # trl 0.24 (the trn1 image)
        return None
    if assistant_only and not has_generation_markers(tokenizer.chat_template):
        return get_training_chat_template(tokenizer)
    return None


def with_labels(example: dict, completion_only_loss: bool) -> dict:
    """``example`` with trl's labels: as given (trl 1.x), or from trl 0.24's masks as its collator builds them
    (completion_mask when completion_only_loss, assistant_masks always)."""
    if "labels" in example:
        return example
    ids = list(example["input_ids"])
    keep = [1] * len(ids)
    if completion_only_loss and "completion_mask" in example:
        keep = [a * b for a, b in zip(keep, example["completion_mask"], strict=True)]
    if "assistant_masks" in example:
        keep = [a * b for a, b in zip(keep, example["assistant_masks"], strict=True)]
    return {**example, "input_ids": ids, "labels": [t if k else IGNORED for t, k in zip(ids, keep, strict=True)]}


def prepared_records(cfg: RunConfig, dataset, tokenizer, name: str = "preview") -> list[dict]:
    """trl's prepared form (input_ids, labels) of each record of ``dataset`` with the run's loss settings; records
    trl drops (cut to data.max_length with no trained token left) are not in it."""
    from trl import SFTConfig, SFTTrainer

    only = completion_only(cfg)
    chat = is_chat(dataset.column_names)
    # No model here: transformers 5's Trainer arguments name checkpointing `activation_checkpointing`, and leaving
    # it unset lets trl's default set the deprecated alias (a FutureWarning); the trn1 lane's trl has neither.
    checkpointing = (
        {"activation_checkpointing": False} if "activation_checkpointing" in SFTConfig.__dataclass_fields__ else {}
    )
    with tempfile.TemporaryDirectory() as scratch:
        args = SFTConfig(
            output_dir=scratch,
            max_length=cfg.data.max_length,
            completion_only_loss=only,
            assistant_only_loss=chat and only,
            report_to="none",
            bf16=False,
            dataset_num_proc=None,
            **checkpointing,
        )
    # The trainer's state its dataset preparation reads, set as SFTTrainer.__init__ sets it (without a model).
    trainer_state = SimpleNamespace(
        _tokenizer=tokenizer,
        chat_template=training_chat_template(tokenizer, args.assistant_only_loss),
        completion_only_loss=only,
        padding_free=False,
        _is_vlm=False,  # trl 0.24
    )
    text_format = None if only or chat else formatting_func(cfg)
    prepared = SFTTrainer._prepare_dataset(
        trainer_state, loss_records(cfg, dataset), tokenizer, args, False, text_format, name
    )
    return [with_labels(prepared[i], only) for i in range(len(prepared))]
