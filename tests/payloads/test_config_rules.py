"""A run-config key's rules live on its field: a Literal type's choices, a Rule for a range or a form;
validate keeps only the checks that join keys. Every rule refuses a value outside it with the key's message."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Literal, get_origin, get_type_hints

import pytest

from llm_pipeline import config

SECTIONS = {f.name: f.default_factory().__class__ for f in dataclasses.fields(config.RunConfig)}
CHOICE_KEYS = [
    (section, item.name)
    for section, cls in SECTIONS.items()
    for item in dataclasses.fields(cls)
    if get_origin(get_type_hints(cls)[item.name]) is Literal
]


def test_the_choice_keys_are_typed_with_their_values():
    assert set(CHOICE_KEYS) >= {
        ("model", "dtype"),
        ("parallel", "strategy"),
        ("train", "backend"),
        ("train", "method"),
        ("train", "attention"),
        ("train", "optimizer"),
        ("torchtitan", "checkpoint_retention"),
    }


@pytest.mark.parametrize(("section", "name"), CHOICE_KEYS)
def test_a_choice_key_refuses_another_value(section, name):
    cfg = dataclasses.replace(
        config.RunConfig(), **{section: dataclasses.replace(getattr(config.RunConfig(), section), **{name: "other"})}
    )
    with pytest.raises(config.ConfigError, match=rf"^{section}\.{name}: invalid value 'other' \(allowed: "):
        config.validate(cfg)


def test_every_range_key_opens_its_doc_line_with_its_rule_and_refuses_a_value_outside():
    ranged = [
        (section, item)
        for section, cls in SECTIONS.items()
        for item in dataclasses.fields(cls)
        if "range" in item.metadata
    ]
    assert len(ranged) >= 30
    for section, item in ranged:
        (rule,) = item.metadata["rules"]
        assert rule.allowed == item.metadata["range"] and not item.metadata["description"].startswith(rule.allowed)
        outside = next(v for v in (-2, -1, 0, 0.5, 1, 1000) if not rule.check(v))
        part = dataclasses.replace(getattr(config.RunConfig(), section), **{item.name: outside})
        with pytest.raises(config.ConfigError, match=rf"^{section}\.{item.name}: invalid value"):
            config.validate(dataclasses.replace(config.RunConfig(), **{section: part}))


def test_validate_keeps_only_the_checks_that_join_keys():
    source = inspect.getsource(config.validate)
    assert len(source.splitlines()) < 60
    checked = {
        node.args[1].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_require"
    }
    own_rules = {f"{s}.{n}" for s, cls in SECTIONS.items() for n in config.field_rules(cls)}
    # a key checked in validate with its own rules too is checked there against another key
    joined = {
        "train.stop_after_step",
        "torchtitan.stop_after_step",
        "lora.target_modules",
        "parallel.tensor_parallel_size",
    }
    assert checked & own_rules <= joined


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"train": {"learnig_rate": 1e-4}}, "train.learnig_rate: unknown key: did you mean 'learning_rate'? (known: "),
        ({"trian": {}}, "trian: unknown section: did you mean 'train'? (known: "),
        ({"train": {"zzz": 1}}, "train.zzz: unknown key (known: "),
    ],
)
def test_a_mistyped_key_gets_the_closest_known_one(raw, message):
    with pytest.raises(config.ConfigError) as refused:
        config.from_dict(raw)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("objective", sorted(config.UNPACKED_OBJECTIVES))
@pytest.mark.parametrize("layout", ["packing", "blocks"])
def test_an_objective_without_packed_records_refuses_packing_and_blocks(objective, layout):
    no_packing, no_blocks = config.UNPACKED_OBJECTIVES[objective]
    why = no_packing if layout == "packing" else no_blocks
    raw = {"train": {"objective": objective, "backend": "torch"}, "data": {"packing": False, layout: True}}
    with pytest.raises(
        config.ConfigError, match=rf"^data\.{layout}: .*false with train\.objective {objective} \("
    ) as e:
        config.from_dict(raw)
    assert why in str(e.value)
    config.from_dict({**raw, "data": {"packing": False}})  # unpacked records: accepted
