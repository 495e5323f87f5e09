"""Preference records for train.objective = "dpo": checked, put in trl's explicit-prompt form, and measured.

What a record may be (docs/training.md, Preference tuning):
- text: ``prompt``, ``chosen``, ``rejected`` strings; or dolly's ``instruction`` (and ``context``; alpaca's
  ``input``) in place of ``prompt``, formatted with the dolly prompt (prompt.format_prompt), the prefix the
  generate and evaluate steps feed the model;
- chat: ``prompt`` a list of {role, content} turns, ``chosen`` and ``rejected`` lists of assistant turns; or no
  ``prompt`` and ``chosen``/``rejected`` whole conversations that share their opening turns (the prompt).

A bad record stops the data step in one line naming the dataset, the record (and its line in a JSONL file) and
the field. Tokens are counted as trl's DPOTrainer counts them (its own tokenization of prompt + answer).
"""

from __future__ import annotations

from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import CHAT_ROLES, format_prompt
from llm_pipeline.run_files import DataStats
from llm_pipeline.training import data_stats

PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")  # trl's explicit-prompt preference form
ANSWERS = PREFERENCE_COLUMNS[1:]
INSTRUCTION_COLUMNS = {"instruction": "instruction", "context": "context", "input": "context"}  # dolly, alpaca


def where(source: str, row: int) -> str:
    """A record named as a person finds it: its number, and its line in a JSON-lines file."""
    line = f" (line {row + 1})" if Path(source).suffix.lower() == ".jsonl" else ""
    return f"data.dataset {source}, record {row}{line}"


def is_turns(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(turn, dict) and turn.get("role") in CHAT_ROLES and isinstance(turn.get("content"), str)
        for turn in value
    )


def text_of(value) -> str:
    return "".join(turn["content"] for turn in value) if isinstance(value, list) else value


def split_shared_prompt(chosen: list, rejected: list) -> tuple[list, list, list]:
    """(prompt, chosen, rejected) of two whole conversations: the prompt is their common opening before the
    first assistant turn that differs."""
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant" and shared == len(chosen):
        shared -= 1  # identical conversations: leave the answers to be refused as identical
    return chosen[:shared], chosen[shared:], rejected[shared:]


def pair(record: dict, row: int, source: str, chat: bool) -> dict:
    """One record as {prompt, chosen, rejected}, or a one-line refusal naming its field."""
    at = where(source, row)
    for name in ANSWERS:
        value = record.get(name)
        if chat and not is_turns(value):
            raise StepError(
                f"{at}: field {name} must be a list of {{role, content}} turns (role one of {', '.join(CHAT_ROLES)}, "
                "text content), as the first record's is"
            )
        if not chat and not isinstance(value, str):
            raise StepError(f"{at}: field {name} must be text, got {type(value).__name__}")
    prompt, chosen, rejected = record.get("prompt"), record["chosen"], record["rejected"]
    if chat and prompt is None:
        prompt, chosen, rejected = split_shared_prompt(chosen, rejected)
    if prompt is None and "instruction" in record:
        prompt = format_prompt(record["instruction"] or "", record.get("context") or "")
    if chat and not (is_turns(prompt) and prompt and prompt[-1]["role"] != "assistant"):
        raise StepError(f"{at}: field prompt must be a list of turns ending with a user or system turn")
    if not chat and not (isinstance(prompt, str) and prompt.strip()):
        raise StepError(f"{at}: field prompt must be non-empty text")
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if chat and not any(turn["role"] == "assistant" for turn in value):
            raise StepError(f"{at}: field {name} has no assistant turn after the prompt, so nothing to prefer")
        if not text_of(value).strip():
            raise StepError(f"{at}: field {name} is empty: a pair needs both answers")
    if chosen == rejected:
        raise StepError(f"{at}: fields chosen and rejected are the same answer, so there is nothing to prefer")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def validate_preferences(dataset, source: str, tokenizer):
    """The records as trl's explicit-prompt preference pairs; refused in one line at the first bad one."""
    import datasets

    if len(dataset) == 0:
        raise StepError(f"data.dataset {source} is empty: there is nothing to train on")
    names = set(dataset.column_names)
    prompt_side = "prompt" in names or "instruction" in names
    missing = [name for name in ANSWERS if name not in names]
    chat = not missing and is_turns(dataset[0]["chosen"])
    if missing or not (prompt_side or chat):
        raise StepError(
            f"data.dataset {source} lacks column(s) {', '.join(missing or ['prompt'])} (has: "
            f"{', '.join(dataset.column_names)}); train.objective dpo needs prompt (or instruction), chosen and "
            "rejected, or chosen and rejected conversations that share their prompt turns"
        )
    renamed = {old: new for old, new in INSTRUCTION_COLUMNS.items() if old in names and "prompt" not in names}
    records = [
        pair({renamed.get(key, key): value for key, value in record.items()}, row, source, chat)
        for row, record in enumerate(dataset)
    ]
    if chat and not tokenizer.chat_template:
        raise StepError(
            f"data.dataset {source} holds chat-format pairs, but the tokenizer has no chat template: train a model "
            "whose tokenizer has one (an instruct model) or give the pairs as text"
        )
    return datasets.Dataset.from_list(records)


def pair_lengths(dataset, tokenizer) -> tuple[list[int], list[int]]:
    """(prompt tokens, prompt + longer answer tokens) of each pair, split as trl's DPOTrainer splits them."""
    prompts, fulls = [], []
    for record in dataset:
        split = [answer_ids(record, name, tokenizer) for name in ANSWERS]
        prompts.append(min(len(prompt) for prompt, _ in split))
        fulls.append(max(len(prompt) + len(answer) for prompt, answer in split))
    return prompts, fulls


def preference_report(dataset, tokenizer, cfg: RunConfig, backend: str) -> DataStats:
    """Each pair is two sequences padded to the longer one (trl's DPO has no packing): the padded layout, counted
    in pairs (what a batch holds), and how many prompts leave no room for an answer (trl drops those pairs)."""
    length = cfg.data.max_length
    prompts, fulls = pair_lengths(dataset, tokenizer)
    kept = sum(min(n, length) for n in fulls)
    counts = {
        "examples": len(fulls),
        "max_length": length,
        "tokens": 2 * kept,
        "mean_tokens_per_example": round(2 * kept / len(fulls), 1),
        "truncated_examples": sum(n > length for n in fulls),
        "prompts_filling_max_length": sum(n >= length for n in prompts),
        "max_length_leaving_room": data_stats.length_leaving_room(prompts, data_stats.NO_ROOM_SHARE),
    }
    return DataStats("padded", {"padded": data_stats.layout_stats(len(fulls), kept, cfg, backend)}, counts)


def describe_preferences(stats: DataStats) -> str:
    counts, padded = stats.counts, stats.layouts["padded"]
    return (
        f"{counts['examples']} preference pairs, {counts['mean_tokens_per_example']} tokens per pair on average "
        f"(prompt + chosen, prompt + rejected), {counts['truncated_examples']} longer than max_length "
        f"{counts['max_length']}; {padded.optimizer_steps_per_epoch} optimizer steps/epoch on {padded.replicas} "
        f"data-parallel replica(s); {counts['prompts_filling_max_length']} prompts fill max_length (trl drops them)"
    )


def answer_ids(record: dict, name: str, tokenizer) -> tuple[list[int], list[int]]:
    """(prompt ids, ``name``'s answer ids) split where trl splits them: where the tokenized prompt and the tokenized
    prompt + answer stop agreeing (plain text gets EOS, as trl adds it)."""
    if isinstance(record["prompt"], list):
        prompt = tokenizer.apply_chat_template(
            record["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        whole = data_stats.chat_ids(record["prompt"] + record[name], tokenizer)
    else:
        prompt = tokenizer(record["prompt"])["input_ids"]
        whole = tokenizer(record["prompt"] + record[name] + tokenizer.eos_token)["input_ids"]
    shared = 0
    while shared < min(len(prompt), len(whole)) and prompt[shared] == whole[shared]:
        shared += 1
    return whole[:shared], whole[shared:]


def describe_pair(record: dict, tokenizer, max_length: int) -> str:
    """The pair as trl trains on it: the prompt, then each answer's trained tokens in [[ ]], cut at max_length."""
    prompt, _ = answer_ids(record, "chosen", tokenizer)
    if len(prompt) >= max_length:
        return f"the trainer drops this pair: its prompt fills data.max_length {max_length}, no answer token is left"
    lines = [f"prompt ({len(prompt)} tokens): {tokenizer.decode(prompt)}"]
    for name in ANSWERS:
        _, answer = answer_ids(record, name, tokenizer)
        kept = answer[: max_length - len(prompt)]
        lines.append(f"{name} ({len(kept)} of {len(answer)} tokens trained): [[{tokenizer.decode(kept)}]]")
    return "\n".join(lines)
