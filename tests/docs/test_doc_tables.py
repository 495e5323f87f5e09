"""Each run-config key is described once, in config.py; the docs table is generated from it."""

from __future__ import annotations

import difflib

import pytest

from tools import doc_tables

HOW_TO_DESCRIBE = (
    "declare it in payloads/llm_pipeline/config.py as `name: type = described(default, "
    '"allowed values: what it does", *rules)` (or `ranged(default, rule, "what it does")` for a numeric range), '
    "then run `make doc-tables`"
)


@pytest.mark.parametrize("key,item", doc_tables.run_config_keys(), ids=[key for key, _ in doc_tables.run_config_keys()])
def test_every_key_has_one_line_description(key, item):
    description = item.metadata.get("description", "")
    assert description.strip(), f"run-config key {key} has no description: {HOW_TO_DESCRIBE}"
    assert "|" not in description and "\n" not in description, f"{key}: a description is one table cell"


@pytest.mark.parametrize("doc", doc_tables.DOCS)
def test_doc_table_is_generated_from_config_py(doc):
    text = (doc_tables.ROOT / doc).read_text()
    current, wanted = doc_tables.current_block(text, doc), doc_tables.generated_block()
    diff = "\n".join(difflib.unified_diff(current.splitlines(), wanted.splitlines(), doc, "config.py", lineterm=""))
    assert current == wanted, (
        f"{doc}'s run-config table differs from payloads/llm_pipeline/config.py. Describe keys only in "
        f"config.py (described(...)) and run `make doc-tables` to rewrite the table:\n{diff}"
    )


def test_the_tool_reports_and_repairs_drift(tmp_path, monkeypatch):
    for doc in doc_tables.DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        stale = doc_tables.generated_block().replace("| `lora.r` | `16` |", "| `lora.r` | `8` |")
        (tmp_path / doc).write_text(f"# {doc}\n\n{stale}\n\nafter\n")
    monkeypatch.setattr(doc_tables, "ROOT", tmp_path)
    assert doc_tables.main(["--check"]) == 1
    assert doc_tables.main([]) == 0
    assert doc_tables.main(["--check"]) == 0
    for doc in doc_tables.DOCS:
        assert (tmp_path / doc).read_text() == f"# {doc}\n\n{doc_tables.generated_block()}\n\nafter\n"
