"""Block mode (data.blocks): a generated text corpus is joined and cut into max_length blocks by the
real data step, with the tiny model's tokenizer; the blocks reach the trainer without formatting and
the collator pads nothing."""

from __future__ import annotations

import json
import random
import re

import pytest
from payload_configs import tiny_config

from llm_pipeline import data
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import format_example
from llm_pipeline.training import text_blocks
from llm_pipeline.training.collator import FixedLengthCollator
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks

BLOCK = 64
WORDS = [
    "the",
    "a",
    "river",
    "stone",
    "light",
    "small",
    "garden",
    "runs",
    "over",
    "under",
    "quietly",
    "bright",
    "seven",
    "old",
    "green",
]


def write_corpus(path, records: int, seed: int = 3) -> list[str]:
    """A JSON Lines corpus of generated sentences of varied lengths (some longer than one block)."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 90))) for _ in range(records)]
    path.write_text("".join(json.dumps({"text": text, "source": "generated"}) + "\n" for text in texts))
    return texts


def expected_stream(texts: list[str], tokenizer) -> list[int]:
    stream: list[int] = []
    for ids in tokenizer(texts)["input_ids"]:
        stream += [*ids, tokenizer.eos_token_id]
    return stream


@pytest.fixture
def corpus_config(hpl_env, tmp_path, monkeypatch):
    monkeypatch.setattr(text_blocks, "MAP_BATCH", 7)  # many map batches: the carried tail crosses them
    texts = write_corpus(tmp_path / "corpus.jsonl", 60)
    cfg = tiny_config(
        hpl_env,
        data={"dataset": str(tmp_path / "corpus.jsonl"), "blocks": True, "packing": False, "max_length": BLOCK,
              "validation_fraction": 0.0, "max_samples": 0},
        train={"method": "full"},
    )  # fmt: skip
    return cfg, texts


def test_blocks_are_the_corpus_token_stream_cut_into_max_length_pieces(corpus_config, capsys):
    cfg, texts = corpus_config
    target = data.prepare(cfg)
    prepared, tokenizer = data.training_inputs(cfg)
    blocks = [row["input_ids"] for row in prepared["train"]]
    stream = expected_stream(texts, tokenizer)
    assert len(blocks) == len(stream) // BLOCK > 7
    assert all(len(block) == BLOCK for block in blocks)
    assert [token for block in blocks for token in block] == stream[: len(blocks) * BLOCK]  # order kept, no gap
    assert prepared["train"].column_names == ["input_ids"]
    report = json.loads((target / "stats.json").read_text())
    assert report["mode"] == "blocks" and report["examples"] == 60
    assert report["corpus_tokens"] == len(stream) and report["dropped_tail_tokens"] == len(stream) % BLOCK
    assert report["blocks"]["pad_fraction"] == 0.0 and report["blocks"]["sequences"] == len(blocks)
    out = capsys.readouterr().out
    assert f"cut into {len(blocks)} blocks of {BLOCK} tokens" in out and "pad tokens: 0.0%" in out


def test_a_block_batch_trains_on_every_token(corpus_config, hpl_env):
    """What the trainer sees: no formatting function, and a collated batch with no padding and no -100."""
    cfg, _ = corpus_config
    data.prepare(cfg)
    prepared, tokenizer = data.training_inputs(cfg)
    assert text_blocks.formatting_func(cfg) is None
    assert text_blocks.formatting_func(tiny_config(hpl_env)) is format_example  # records are formatted per example
    collator = FixedLengthCollator(pad_token_id=tokenizer.eos_token_id, max_length=BLOCK)
    batch = collator([prepared["train"][i] for i in range(4)])
    assert batch["input_ids"].shape == (4, BLOCK)
    assert bool((batch["labels"] != -100).all()) and bool((batch["attention_mask"] == 1).all())


def test_dolly_records_are_formatted_then_joined(hpl_env, tmp_path):
    records = tiny.dolly_records(30)
    path = tmp_path / "dolly.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    cfg = tiny_config(
        hpl_env, data={"dataset": str(path), "blocks": True, "packing": False, "max_length": BLOCK,
                       "validation_fraction": 0.0, "max_samples": 0}
    )  # fmt: skip
    data.prepare(cfg)
    prepared, tokenizer = data.training_inputs(cfg)
    stream = expected_stream([format_example(record) for record in records], tokenizer)
    joined = [token for row in prepared["train"] for token in row["input_ids"]]
    assert joined == stream[: len(joined)] and len(joined) == len(stream) - len(stream) % BLOCK


def test_a_corpus_without_its_text_column_names_the_key(hpl_env, tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"body": "some words here"}) + "\n")
    cfg = tiny_config(hpl_env, data={"dataset": str(path), "blocks": True, "packing": False})
    with pytest.raises(StepError, match=r"data.text_field column 'text'.*it has: body.*set data.text_field"):
        data.prepare(cfg)


def test_a_corpus_shorter_than_one_block_is_refused(hpl_env, tmp_path):
    write_corpus(tmp_path / "tiny.jsonl", 1)
    cfg = tiny_config(hpl_env, data={"dataset": str(tmp_path / "tiny.jsonl"), "blocks": True, "packing": False,
                                     "max_length": 4096})  # fmt: skip
    with pytest.raises(StepError, match=r"fewer than one block of data.max_length 4096"):
        data.prepare(cfg)


def test_packing_with_blocks_is_refused(hpl_env):
    from llm_pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.packing: invalid value True.*false with data.blocks"):
        tiny_config(hpl_env, data={"blocks": True, "packing": True})


@pytest.mark.main_stack
def test_full_fine_tuning_on_blocks_with_the_reference_optimizer_trains_and_saves_nothing(
    hpl_env, tmp_path, capsys, monkeypatch
):
    """The torch engine runs the blocks as they are (no formatting), with the full configs' optimizer
    settings (cosine to a floor, betas, weight decay) and save_checkpoints = false, as a sweep point."""
    from payload_configs import write_config

    from llm_pipeline import train

    write_corpus(tmp_path / "corpus.jsonl", 80)
    path = write_config(
        tmp_path / "run.toml",
        hpl_env,
        data={"dataset": str(tmp_path / "corpus.jsonl"), "blocks": True, "packing": False, "max_length": BLOCK,
              "validation_fraction": 0.0, "max_samples": 0},
        train={"method": "full", "max_steps": 4, "logging_steps": 1, "learning_rate": 3e-4,
               "lr_scheduler": "cosine_with_min_lr", "min_learning_rate": 3e-5, "warmup_steps": 1,
               "adam_beta2": 0.95, "weight_decay": 0.1, "save_checkpoints": False},
    )  # fmt: skip
    assert train.main(["--prepare-data", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "step 4/4 | loss" in out
    assert "newest checkpoint: none" in out
    learning_rates = [float(rate) for rate in re.findall(r"\| lr ([0-9.e+-]+) \|", out)]
    assert max(learning_rates) == pytest.approx(3e-4, rel=1e-3)  # the peak after warm-up
    # at 2/3 of the 3 decay steps the cosine stands a quarter of the way above the floor (7.5e-5 without it)
    assert learning_rates[-1] == pytest.approx(3e-5 + (3e-4 - 3e-5) * 0.25, rel=1e-2)
