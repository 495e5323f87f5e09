"""Every shape of data the data step meets is either read, with what it lacks counted, or refused in one
``error:`` line (exit 2): empty assistant turns, non-UTF-8 bytes, all-empty CSV columns, alpaca with or without
input, a path that is not a file (refused before any Hub call); and a property test over the shapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from payload_configs import write_config

from llm_pipeline import data
from llm_pipeline.config import DataConfig
from llm_pipeline.errors import StepError
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks


def _chat(answer: str) -> dict:
    return {"messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": answer}]}


def _load(path, tokenizer=None):
    return data.validated_records(DataConfig(dataset=str(path)), tokenizer or tiny.build_tokenizer())


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_chat_records_with_empty_assistant_turns_are_counted_and_refused_above_half(tmp_path, capsys):
    tokenizer = tiny.build_tokenizer()
    few = _jsonl(tmp_path / "few.jsonl", [_chat("") for _ in range(10)] + [_chat("Because.") for _ in range(30)])
    assert len(data.validated_records(DataConfig(dataset=few, completion_only_loss=False), tokenizer)) == 40
    assert "10 of 40 records have an empty assistant turn" in capsys.readouterr().out
    most = _jsonl(tmp_path / "most.jsonl", [_chat(" ") for _ in range(30)] + [_chat("Because.") for _ in range(10)])
    with pytest.raises(StepError, match=r"30 of 40 records have an empty assistant turn \(75%; refused above 50%\)"):
        data.validated_records(DataConfig(dataset=most, completion_only_loss=False), tokenizer)


def test_non_utf8_bytes_are_named_by_file_and_line(hpl_env, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    tiny.write_dolly_jsonl(rows, 5)
    lines = rows.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"e", b"\xe9", 1)
    rows.write_bytes(b"".join(lines))
    path = write_config(tmp_path / "run.toml", hpl_env, data={"dataset": str(rows)})
    assert data.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"data.dataset {rows}: line 3 is not UTF-8 text (byte 0xe9" in err


def test_a_csv_whose_context_is_empty_in_every_row_reads_as_empty_context(tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("instruction,context,response\nWhy?,,Because.\nHow?,,Like so.\n")
    assert [dict(row) for row in _load(rows)] == [
        {"instruction": "Why?", "context": "", "response": "Because."},
        {"instruction": "How?", "context": "", "response": "Like so."},
    ]


@pytest.mark.parametrize("with_input", [True, False], ids=["with-input", "without-input"])
def test_alpaca_records_with_or_without_input_read_as_dolly(tmp_path, with_input):
    row = {"instruction": "Why?", "output": "Because.", **({"input": "Facts."} if with_input else {})}
    loaded = _load(_jsonl(tmp_path / "alpaca.jsonl", [row]))
    assert [dict(r) for r in loaded] == [
        {"instruction": "Why?", "context": "Facts." if with_input else "", "response": "Because."}
    ]


def test_a_file_name_that_is_not_a_file_is_refused_before_any_hub_call(tmp_path, monkeypatch):
    import datasets

    def no_hub(*args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StepError, match=rf"data.dataset nope.jsonl: no such file or folder \(looked in {tmp_path}\)"):
        data.load_source(DataConfig(dataset="nope.jsonl"))


TEXTS = st.one_of(
    st.none(),
    st.just(""),
    st.integers(-5, 5),
    st.text(max_size=8),
    st.text(min_size=300, max_size=600),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(["jsonl", "csv", "chat", "alpaca"]),
    rows=st.lists(st.tuples(TEXTS, TEXTS, TEXTS), min_size=0, max_size=6),
    bad_bytes=st.booleans(),
)
def test_every_shape_is_read_with_counts_or_refused_in_one_line(tmp_path_factory, capsys, form, rows, bad_bytes):
    folder = tmp_path_factory.mktemp("shape")
    if form == "chat":
        records = [_chat(answer if isinstance(answer, str) else "") for _, _, answer in rows]
    elif form == "alpaca":
        records = [{"instruction": q, "input": c, "output": a} for q, c, a in rows]
    else:
        records = [{"instruction": q, "context": c, "response": a} for q, c, a in rows]
    if form == "csv":
        import csv

        path = folder / "rows.csv"
        with path.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=["instruction", "context", "response"])
            writer.writeheader()
            writer.writerows([{k: "" if v is None else v for k, v in r.items()} for r in records])
    else:
        path = folder / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if bad_bytes and records:
        path.write_bytes(path.read_bytes() + b"\xff\n")
    capsys.readouterr()
    try:
        loaded = data.validated_records(
            DataConfig(dataset=str(path), completion_only_loss=False), tiny.build_tokenizer()
        )
    except StepError as refused:
        assert "\n" not in str(refused) and str(refused).startswith(f"data.dataset {path}")
        return
    assert not (bad_bytes and records), "non-UTF-8 bytes were read"
    assert len(loaded) == len(records) > 0
    out = capsys.readouterr().out
    empty = sum(not (a if isinstance(a, str) else "").strip() for *_, a in rows) if form == "chat" else None
    if empty:
        assert f"{empty} of {len(records)} records have an empty assistant turn" in out
    for record in loaded if form != "chat" else ():
        assert all(isinstance(record[name], str) for name in ("instruction", "context", "response"))
