"""GRPO's reward functions (grpo.rewards): the built-ins and a user's ``file.py:function``, each called as trl's
GRPOTrainer calls a reward function (keyword arguments: prompts, completions, the records' other columns such as
``answer``; one float per completion). A function's ``__name__`` names its metrics (``rewards/<name>/mean``)."""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable
from pathlib import Path

from llm_pipeline.config import GrpoConfig
from llm_pipeline.errors import StepError

ANSWER_COLUMN = "answer"  # the prepared records' reference column, which the built-ins read
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(completion) -> str:
    """A completion as text: trl passes a string, or for chat prompts the list of assistant messages."""
    return completion if isinstance(completion, str) else "".join(turn["content"] for turn in completion)


def exact_match(completions, answer, **_) -> list[float]:
    return [float(completion_text(c).strip() == (a or "").strip()) for c, a in zip(completions, answer, strict=True)]


def format_reward(pattern: str) -> Callable[..., list[float]]:
    compiled = re.compile(pattern)

    def format(completions, **_) -> list[float]:  # the reward's name in the config and the metrics
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    return format


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def math_answer(completions, answer, **_) -> list[float]:
    """1 when the completion's last number equals the answer's last number (GSM8K's '#### 42' included)."""
    scores = []
    for completion, reference in zip(completions, answer, strict=True):
        got, want = last_number(completion_text(completion)), last_number(reference)
        scores.append(float(got is not None and want is not None and math.isclose(got, want, abs_tol=1e-6)))
    return scores


def user_reward(path: str, function: str) -> Callable[..., list[float]]:
    """The user's function from their file (config.check_user_reward checked it at submit, without running it)."""
    key = f"grpo.rewards: {path}:{function}"
    if not Path(path).is_file():
        raise StepError(f"{key}: no such file; upload it beside the run config")
    spec = importlib.util.spec_from_file_location(f"hpl_reward_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module: whatever it raises is theirs to fix
        raise StepError(f"{key}: importing the file failed: {type(exc).__name__}: {exc}") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise StepError(f"{key}: {function} is not a function of the file")
    return found


def reward_functions(grpo: GrpoConfig) -> list[Callable[..., list[float]]]:
    """grpo.rewards, in order."""
    builtins = {"exact_match": exact_match, "format": format_reward(grpo.format_pattern), "math_answer": math_answer}
    return [builtins[item] if item in builtins else user_reward(*item.rsplit(":", 1)) for item in grpo.rewards]
