"""The dolly prompt format, used by training and generation alike.

Chat-format records (a `messages` column) skip this format: the tokenizer's chat template formats
them (the torch engine only); generation keeps using the dolly prompt.

Real newlines separate the sections (the reference wrote a literal backslash-n). The context
section is left out when a record has none. Training text is `format_prompt(...) + response`, so
generation feeds the model exactly the prefix it was trained on.
"""

from __future__ import annotations

from collections.abc import Mapping

INSTRUCTION_HEADER = "### Instruction"
CONTEXT_HEADER = "### Context"
ANSWER_HEADER = "### Answer"
COLUMNS = ("instruction", "context", "response")
REQUIRED_COLUMNS = ("instruction", "response")
# Chat-format records: one column of turns, each {role, content}, formatted by the tokenizer's chat template.
MESSAGES_COLUMN = "messages"
PROMPT_COLUMN = "prompt"  # GRPO's records: the prompt the rollouts continue (train.objective grpo)
CHAT_ROLES = ("system", "user", "assistant")
# The marker transformers needs in a chat template to report which tokens the assistant wrote.
GENERATION_MARKER = "{% generation %}"


def is_chat(column_names) -> bool:
    """Records in chat format (a messages column) rather than the dolly schema."""
    return MESSAGES_COLUMN in column_names


def format_prompt(instruction: str, context: str = "") -> str:
    """The text up to where the answer starts."""
    sections = [f"{INSTRUCTION_HEADER}\n{instruction.strip()}"]
    if context and context.strip():
        sections.append(f"{CONTEXT_HEADER}\n{context.strip()}")
    sections.append(f"{ANSWER_HEADER}\n")
    return "\n\n".join(sections)


def prompt_completion(record: Mapping[str, str | None]) -> dict[str, str]:
    """One dolly record as a prompt and its completion (trl's prompt-completion form): the text up to the
    answer, and the answer."""
    return {
        "prompt": format_prompt(record["instruction"] or "", record.get("context") or ""),
        "completion": (record["response"] or "").strip(),
    }


def format_example(record: Mapping[str, str | None]) -> str:
    """One training text from one dolly record (the per-example formatting function)."""
    pair = prompt_completion(record)
    return pair["prompt"] + pair["completion"]


def template_skeleton() -> str:
    """The longest form of the template with every field empty: what the headers alone cost."""
    return f"{INSTRUCTION_HEADER}\n\n\n{CONTEXT_HEADER}\n\n\n{ANSWER_HEADER}\n"
