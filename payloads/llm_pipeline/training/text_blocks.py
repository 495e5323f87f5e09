"""Block mode (data.blocks): a text corpus tokenized, joined and cut into data.max_length blocks.

The usual causal-LM recipe for full fine-tuning: each record's text (the data.text_field column, else
the dolly prompt format) is tokenized as the trainer would (the tokenizer's own special tokens) with
EOS appended, all records are joined into one token stream in order, and the stream is cut into
blocks of exactly data.max_length tokens; the tail shorter than one block is dropped. Every position
of a block is a real token and a label: no padding, so a 4096-token step trains on 4096 tokens.
There is no per-example attention mask: a record attends to the records before it in its block,
after their EOS, as in pretraining (the Neuron Llama ignores attention masks anyway).

The prepared dataset holds ``input_ids`` only; the trainers then skip their per-example formatting
(``formatting_func``) and the collator has nothing to pad.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm_pipeline.config import DataConfig, RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import COLUMNS, REQUIRED_COLUMNS, format_example
from llm_pipeline.run_files import DataStats
from llm_pipeline.training.data_stats import layout_stats

MAP_BATCH = 1000  # records tokenized per datasets.map call; the unfinished block carries over


def formatting_func(cfg: RunConfig) -> Callable[[Any], str] | None:
    """What the trainers format each example with: nothing in block mode (the data is tokenized)."""
    return None if cfg.data.blocks else format_example


def record_texts(dataset, data: DataConfig):
    """A dataset with one ``text`` column: data.text_field as is, or dolly records in the prompt format."""
    source = data.dataset
    if len(dataset) == 0:
        raise StepError(f"data.dataset {source} is empty: there is nothing to train on")
    columns = dataset.column_names
    if data.text_field in columns:
        dtype = getattr(dataset.features[data.text_field], "dtype", None)
        if dtype not in ("string", "large_string"):
            raise StepError(
                f"data.text_field {data.text_field!r}: column of {source} holds {dataset.features[data.text_field]}, "
                "expected text"
            )
        return dataset.map(
            lambda record: {"text": record[data.text_field] or ""},
            remove_columns=columns,
            desc="reading texts",
        )
    if all(name in columns for name in REQUIRED_COLUMNS):
        return dataset.map(
            lambda record: {"text": format_example({name: record.get(name) or "" for name in COLUMNS})},
            remove_columns=columns,
            desc="formatting dolly records",
        )
    raise StepError(
        f"data.dataset {source} has neither the data.text_field column {data.text_field!r} nor the dolly columns "
        f"{', '.join(REQUIRED_COLUMNS)} (it has: {', '.join(columns)}): set data.text_field to its text column"
    )


class _Blocker:
    """Cuts a stream of token lists into fixed-size blocks, carrying the unfinished block across batches."""

    def __init__(self, tokenizer, max_length: int):
        if tokenizer.eos_token_id is None:
            raise StepError(f"the tokenizer ({type(tokenizer).__name__}) has no EOS token to separate the records")
        self.tokenizer, self.max_length = tokenizer, max_length
        self.carry: list[int] = []
        self.tokens = 0

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        stream = self.carry
        for ids in self.tokenizer(batch["text"])["input_ids"]:
            stream.extend(ids)
            stream.append(self.tokenizer.eos_token_id)
            self.tokens += len(ids) + 1
        whole = len(stream) - len(stream) % self.max_length
        blocks = [stream[start : start + self.max_length] for start in range(0, whole, self.max_length)]
        self.carry = stream[whole:]
        return {"input_ids": blocks}


def build_blocks(texts, tokenizer, max_length: int):
    """(blocks dataset with ``input_ids``, tokens in the corpus, tokens of the dropped tail)."""
    blocker = _Blocker(tokenizer, max_length)
    blocks = texts.map(
        blocker,
        batched=True,
        batch_size=MAP_BATCH,
        remove_columns=texts.column_names,
        load_from_cache_file=False,  # the carried tail makes each batch depend on the ones before it
        desc=f"cutting into {max_length}-token blocks",
    )
    if len(blocks) == 0:
        raise StepError(
            f"the {len(texts)} record(s) of data.dataset hold {blocker.tokens} tokens, fewer than one block of "
            f"data.max_length {max_length}: use a larger corpus or a smaller data.max_length"
        )
    return blocks, blocker.tokens, len(blocker.carry)


def block_report(
    records: int, blocks: int, corpus_tokens: int, dropped: int, cfg: RunConfig, backend: str
) -> DataStats:
    """The data step's report in block mode: what the blocks hold, and their (zero) padding."""
    length = cfg.data.max_length
    counts = {
        "examples": records,
        "max_length": length,
        "corpus_tokens": corpus_tokens,
        "tokens": blocks * length,
        "dropped_tail_tokens": dropped,
    }
    return DataStats("blocks", {"blocks": layout_stats(blocks, blocks * length, cfg, backend)}, counts)


def describe_blocks(stats: DataStats) -> str:
    counts, blocks = stats.counts, stats.trained
    return (
        f"block mode: {counts['examples']} records, {counts['corpus_tokens']} tokens with EOS, cut into "
        f"{blocks.sequences} blocks of {counts['max_length']} tokens ({counts['dropped_tail_tokens']} tail tokens "
        f"dropped)\npad tokens: {blocks.pad_fraction:.1%} ({blocks.optimizer_steps_per_epoch} optimizer "
        f"steps/epoch on {blocks.replicas} data-parallel replica(s))"
    )
