"""A tiny random Llama, a tiny tokenizer and dolly- or chat-format records, all made locally.

Used by the offline rehearsal and the tests: nothing is downloaded, yet every step runs the same
code paths it runs on the real model (a Llama config, a fast tokenizer with a chat template in
the dolly headers' words, safetensors weights).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# One OpenMP thread per process for the tiny model's steps on this host: its matrices are too small for a second
# thread to pay for its start and spin-waits. A tiny training on 2 cores took 14.2 s with one thread against 17.6 s
# with one per core, and three at once (three chains, or make test's workers) 19.6 s against 32.0 s: six threads
# spinning on two cores (docs/testing.md). A value the caller set is kept.
HOST_THREADS = {"OMP_NUM_THREADS": "1"}

WORDS = [
    "llama",
    "alpaca",
    "camel",
    "wool",
    "andes",
    "herd",
    "graze",
    "fiber",
    "animal",
    "mountain",
    "valley",
    "farmer",
    "river",
    "cloud",
    "water",
    "stone",
    "green",
    "small",
    "large",
    "gentle",
    "quick",
    "slow",
    "warm",
    "cold",
    "high",
    "low",
    "bright",
    "dark",
    "answer",
    "question",
    "context",
    "instruction",
    "response",
    "explain",
    "describe",
    "list",
    "name",
    "compare",
    "why",
    "how",
    "what",
]
CATEGORIES = ("open_qa", "closed_qa", "brainstorming", "summarization", "classification")


def dolly_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Records with the dolly-15k columns; about a third carry a context."""
    rng = random.Random(seed)

    def sentence(low: int, high: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))

    return [
        {
            "instruction": sentence(4, 10).capitalize() + "?",
            "context": sentence(8, 20).capitalize() + "." if i % 3 == 0 else "",
            "response": sentence(6, 24).capitalize() + ".",
            "category": CATEGORIES[i % len(CATEGORIES)],
        }
        for i in range(count)
    ]


def write_dolly_jsonl(path: Path, count: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for record in dolly_records(count, seed):
            out.write(json.dumps(record) + "\n")
    return path


# A dataset card in c4's layout: its YAML header defines the "en" config torchtitan's c4 loader
# asks for, with a train and a validation split of gzipped JSON-lines shards.
C4_CARD = """---
configs:
- config_name: en
  data_files:
  - split: train
    path: en/c4-train.*.json.gz
  - split: validation
    path: en/c4-validation.*.json.gz
---
# tiny c4-format dataset (rehearsals and tests)
"""


def write_c4_folder(folder: Path, *, shards: int = 2, records: int = 40, card: bool = True) -> Path:
    """A c4-format dataset folder: records with c4's columns (text, timestamp, url), random words."""
    import gzip

    rng = random.Random(0)
    for split, count in (("train", shards), ("validation", 1)):
        for index in range(count):
            path = folder / "en" / f"c4-{split}.{index:05d}-of-{count:05d}.json.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wt") as out:
                for number in range(records):
                    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))).capitalize() + "."
                    row = {"text": text, "timestamp": "2019-04-25T12:00:00Z", "url": f"https://example.com/{number}"}
                    out.write(json.dumps(row) + "\n")
    if card:
        (folder / "README.md").write_text(C4_CARD)
    return folder


# A chat template in the dolly headers' words (the tiny vocabulary has them), with the generation markers
# transformers needs to report the assistant's tokens (trl's assistant_only_loss).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}### Context\n{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}### Instruction\n{{ message['content'] }}\n\n"
    "{% else %}### Answer\n{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}\n\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}### Answer\n{% endif %}"
)


def chat_records(count: int, seed: int = 0) -> list[dict[str, list[dict[str, str]]]]:
    """Chat-format records (messages): two question-answer rounds each, a context as system turn when the
    first dolly record has one."""
    dolly = dolly_records(2 * count, seed)
    records = []
    for first, second in zip(dolly[::2], dolly[1::2], strict=True):
        system = [{"role": "system", "content": first["context"]}] if first["context"] else []
        turns = [
            {"role": role, "content": record[key]}
            for record in (first, second)
            for role, key in (("user", "instruction"), ("assistant", "response"))
        ]
        records.append({"messages": system + turns})
    return records


def write_chat_jsonl(path: Path, count: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in chat_records(count, seed)))
    return path


def preference_records(count: int, seed: int = 0, *, chat: bool = False) -> list[dict]:
    """Preference pairs (train.objective dpo): the dolly prompt with its response chosen and the response's words
    reversed rejected; ``chat``: the prompt as a user turn and each answer as an assistant turn."""
    pairs = []
    for record in dolly_records(count, seed):
        chosen = record["response"]
        rejected = " ".join(reversed(chosen.rstrip(".").split())).capitalize() + "."
        if chat:
            turn = [{"role": "user", "content": record["instruction"]}]
            pairs.append(
                {
                    "prompt": turn,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )
        else:
            pairs.append(
                {
                    "instruction": record["instruction"],
                    "context": record["context"],
                    "chosen": chosen,
                    "rejected": rejected,
                }
            )
    return pairs


def write_preference_jsonl(path: Path, count: int, seed: int = 0, *, chat: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in preference_records(count, seed, chat=chat)))
    return path


def build_tokenizer():
    """A word-level fast tokenizer over the tiny vocabulary, saved like a Hub tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|unk|>"]
    punctuation = list("#:.,?!'\"-()\n")
    vocab = {
        token: i
        for i, token in enumerate(specials + punctuation + sorted(set(WORDS) | {w.capitalize() for w in WORDS}))
    }
    for word in ("Instruction", "Context", "Answer", "Response", "Below", "is", "an", "that", "a", "task"):
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_llama(
    vocab_size: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    head_std: float | None = None,
):
    """A randomly initialised LlamaForCausalLM with GQA (kv_heads < heads), like Llama 3; ``head_std``: the output
    layer's init std instead of the config's initializer_range (STEERABLE_HEAD_STD)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    if head_std is not None:
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, head_std)
    return model


def write_tiny_model(folder: Path, *, dtype: str = "float32", seed: int = 0, **shape) -> Path:
    """Save a tiny Llama + tokenizer to `folder` as a Hub-style model folder (safetensors)."""
    import torch

    tokenizer = build_tokenizer()
    model = build_llama(len(tokenizer), seed=seed, **shape).to(getattr(torch, dtype))
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


# A tiny lm-eval task in the harness's standard task format (tiny_tasks/: a YAML beside its data): multiple choice
# over the tiny vocabulary, so the tiny model scores real log-likelihoods. Its data_files is relative: the benchmark
# step runs lm-eval inside the task folder, as it does with a user's own uploaded tasks. A folder in the repository,
# so the rehearsal's run config can name it before anything is written (config.load checks benchmark.task_dir).
TINY_TASK = "tiny_words"
TINY_TASK_DIR = Path(__file__).with_name("tiny_tasks")
# vLLM's CPU attention serves head sizes from 32 (llm_pipeline.vllm_server.CPU_HEAD_SIZES): the tiny Llama with two
# heads of 32 (hidden 64) where a run serves it.
SERVABLE_SHAPE = {"heads": 2, "kv_heads": 1}
# The output layer's init std where an adapter must move the model's output (GRPO's rehearsal). With the default
# 0.02 the logits are 0.02 x |normed hidden state| (8 at hidden 64), so about 0.16 wide: the output is uniform
# whatever the adapter does to the hidden state, the entropy stays at ln(vocab) and the reward cannot rise. At 0.2
# the logits span a few nats, and a LoRA on attention and MLP steers them within a few steps.
STEERABLE_HEAD_STD = 0.2


def write_tiny_task(folder: Path) -> Path:
    """A copy of the tiny task folder (lm-eval reads it with --include_path) to change."""
    import shutil

    return Path(shutil.copytree(TINY_TASK_DIR, folder))
