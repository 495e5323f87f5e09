"""How much of each batch is padding, padded to max_length (the reference) and packed.

Texts are tokenized exactly as the trainer does it (prompt format + EOS, the tokenizer's own special
tokens; chat-format records through the tokenizer's chat template, as trl does), and packing uses
trl's own best-fit-decreasing packer, so the numbers describe the run.
"""

from __future__ import annotations

import math

from llm_pipeline.config import RunConfig, data_parallel_size
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import (
    MESSAGES_COLUMN,
    PROMPT_COLUMN,
    format_example,
    format_prompt,
    is_chat,
    template_skeleton,
)
from llm_pipeline.run_files import DataStats, LayoutStats, data_layout


def check_template_fits(tokenizer, max_length: int) -> None:
    """The headers, EOS and at least one answer token must fit in max_length."""
    needed = len(tokenizer(template_skeleton() + tokenizer.eos_token)["input_ids"]) + 1
    if needed > max_length:
        raise StepError(
            f"data.max_length {max_length} is shorter than the prompt template ({needed} tokens with an empty "
            "instruction, context and a one-token answer): raise data.max_length"
        )


def layout_stats(sequences: int, tokens: int, cfg: RunConfig, backend: str) -> LayoutStats:
    """One layout's report: its padding, and the optimizer steps one pass takes on the backend's
    data-parallel replicas (config.data_parallel_size: per rank, then gradient accumulation)."""
    replicas = data_parallel_size(cfg, backend)
    batches_per_rank = math.ceil(sequences / (replicas * cfg.train.per_device_batch_size))
    steps = math.ceil(batches_per_rank / cfg.train.gradient_accumulation_steps)
    pad_fraction = round(1 - tokens / (sequences * cfg.data.max_length), 4) if sequences else 0.0
    return LayoutStats(sequences, pad_fraction, steps, replicas)


def chat_ids(messages: list[dict], tokenizer) -> list[int]:
    """One chat-format record's token ids, as trl tokenizes it (the chat template, no extra EOS). transformers 5
    returns a dict from apply_chat_template unless told otherwise (4.x returned the ids)."""
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)


def first_prompt(messages: list[dict]) -> list[dict]:
    """The turns before the first answer: what must fit for the model to see anything to answer."""
    first_answer = next(i for i, turn in enumerate(messages) if turn["role"] == "assistant")
    return messages[:first_answer]


def token_ids(dataset, tokenizer) -> tuple[list[list[int]], list[int]]:
    """(each record's training token ids, each record's first prompt length in tokens)."""
    if is_chat(dataset.column_names):
        conversations = dataset[MESSAGES_COLUMN]
        ids = [chat_ids(messages, tokenizer) for messages in conversations]
        prompt_lengths = [
            len(
                tokenizer.apply_chat_template(
                    first_prompt(messages), tokenize=True, add_generation_prompt=True, return_dict=False
                )
            )
            for messages in conversations
        ]
        return ids, prompt_lengths
    if PROMPT_COLUMN in dataset.column_names:  # GRPO's prompt records: the prompt is what data.max_length holds
        ids = tokenizer(list(dataset[PROMPT_COLUMN]))["input_ids"]
        return ids, [len(x) for x in ids]
    texts = [format_example(record) + tokenizer.eos_token for record in dataset]
    prompts = [format_prompt(record["instruction"], record["context"]) for record in dataset]
    return tokenizer(texts)["input_ids"], [len(p) for p in tokenizer(prompts)["input_ids"]]


NO_ROOM_SHARE = 0.1  # data.NO_ROOM_REFUSED_ABOVE: the share of prompts the suggested length may still fill


def length_leaving_room(prompt_lengths: list[int], share: float) -> int:
    """The shortest max_length whose prompts fill it in at most ``share`` of the records (one answer token
    past every other prompt)."""
    ordered = sorted(prompt_lengths)
    allowed = math.floor(share * len(ordered))
    return ordered[len(ordered) - allowed - 1] + 1


def padding_report(dataset, tokenizer, cfg: RunConfig, backend: str) -> DataStats:
    import datasets
    from trl import pack_dataset

    length = cfg.data.max_length
    ids, prompt_lengths = token_ids(dataset, tokenizer)
    kept = sum(min(len(x), length) for x in ids)
    # GRPO: every prompt is sampled grpo.num_generations times, each completion one sequence of the batch
    repeats = cfg.grpo.num_generations if PROMPT_COLUMN in dataset.column_names else 1
    packed_rows = len(pack_dataset(datasets.Dataset.from_dict({"input_ids": ids}), length, "bfd"))
    counts = {
        "examples": len(ids),
        "max_length": length,
        "tokens": kept,
        "mean_tokens_per_example": round(kept / len(ids), 1),
        "truncated_examples": sum(len(x) > length for x in ids),
        "prompts_filling_max_length": sum(n >= length for n in prompt_lengths),
        "max_length_leaving_room": length_leaving_room(prompt_lengths, NO_ROOM_SHARE),
    }
    layouts = {
        "padded": layout_stats(len(ids) * repeats, kept * repeats, cfg, backend),
        "packed": layout_stats(packed_rows * repeats, kept * repeats, cfg, backend),
    }
    return DataStats(data_layout(False, cfg.data.packing), layouts, counts)


def describe(stats: DataStats) -> str:
    counts, padded, packed = stats.counts, stats.layouts["padded"], stats.layouts["packed"]
    lines = [
        f"{counts['examples']} examples, {counts['mean_tokens_per_example']} tokens on average, "
        f"{counts['truncated_examples']} longer than max_length {counts['max_length']}",
        f"pad tokens: {padded.pad_fraction:.1%} padded to max_length ({padded.sequences} sequences, "
        f"{padded.optimizer_steps_per_epoch} optimizer steps/epoch), {packed.pad_fraction:.1%} packed "
        f"({packed.sequences} sequences, {packed.optimizer_steps_per_epoch} steps/epoch) on {padded.replicas} "
        "data-parallel replica(s)",
        f"packing is {'on' if stats.mode == 'packed' else 'off'} (data.packing)",
    ]
    if counts["prompts_filling_max_length"]:
        lines.append(
            f"warning: {counts['prompts_filling_max_length']} prompts fill max_length and leave no room for the answer"
        )
    return "\n".join(lines)
