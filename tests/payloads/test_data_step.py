"""The dolly prompt format and the data step: sources, validation, split, padding report."""

from __future__ import annotations

import json

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import data, train
from llm_pipeline.config import DataConfig, RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import format_example, format_prompt
from llm_pipeline.run_files import DATA_STATS_FILE
from llm_pipeline.training import data_stats
from tools import tiny_model as tiny

pytestmark = pytest.mark.both_stacks


def test_prompt_uses_real_newlines_and_skips_an_empty_context():
    text = format_example({"instruction": "Why?", "context": "", "response": "Because."})
    assert text == "### Instruction\nWhy?\n\n### Answer\nBecause."
    assert "\\n" not in text


def test_prompt_with_context_and_generation_prefix():
    record = {"instruction": " Why? ", "context": "Some facts.", "response": "Because."}
    assert format_example(record) == "### Instruction\nWhy?\n\n### Context\nSome facts.\n\n### Answer\nBecause."
    assert format_example(record).startswith(format_prompt("Why?", "Some facts."))


def _records_in_every_format(folder):
    import datasets

    records = tiny.dolly_records(12)
    jsonl = tiny.write_dolly_jsonl(folder / "rows.jsonl", 12)
    (folder / "rows.json").write_text(json.dumps(records))
    datasets.Dataset.from_list(records).to_parquet(str(folder / "rows.parquet"))
    tiny.write_dolly_jsonl(folder / "as-folder" / "train.jsonl", 12)
    return records, [jsonl, folder / "rows.json", folder / "rows.parquet", folder / "as-folder"]


def test_every_local_source_gives_the_same_records(tmp_path):
    records, sources = _records_in_every_format(tmp_path)
    for source in sources:
        loaded = data.validate(data.load_source(DataConfig(dataset=str(source))), str(source))
        assert [dict(row) for row in loaded] == [
            {k: r[k] for k in ("instruction", "context", "response")} for r in records
        ], source


def test_missing_context_column_becomes_empty_context(tmp_path):
    import datasets

    rows = datasets.Dataset.from_list([{"instruction": "Why?", "response": "Because."}])
    assert list(data.validate(rows, "x")) == [{"instruction": "Why?", "context": "", "response": "Because."}]


def test_missing_columns_are_named(tmp_path):
    import datasets

    rows = datasets.Dataset.from_list([{"question": "Why?", "response": "Because."}])
    with pytest.raises(StepError, match=r"lacks column.*instruction.*has: question, response"):
        data.validate(rows, "x")


def test_empty_dataset_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    source = DataConfig(dataset=str(tmp_path / "empty.jsonl"))
    with pytest.raises(StepError, match="is empty"):
        data.validate(data.load_source(source), source.dataset)


def test_missing_local_file_is_an_error(tmp_path):
    with pytest.raises(StepError, match="no such file"):
        data.load_source(DataConfig(dataset=str(tmp_path / "nope.jsonl")))


def test_max_length_shorter_than_the_template_is_an_error():
    tokenizer = tiny.build_tokenizer()
    data_stats.check_template_fits(tokenizer, 16)
    with pytest.raises(StepError, match=r"data\.max_length 8 is shorter than the prompt template"):
        data_stats.check_template_fits(tokenizer, 8)


def test_blog_run_has_1251_optimizer_steps_per_epoch():
    # 15,011 dolly rows, 32 cores / TP 8 = DP 4 on the neuron backend, batch 1, GA 3 (the blog's numbers).
    stats = data_stats.layout_stats(15011, 15011 * 100, RunConfig(), "neuron")
    assert (stats.replicas, stats.optimizer_steps_per_epoch) == (4, 1251)


def test_prepare_splits_saves_and_reports_padding(hpl_env, capsys):
    cfg = tiny_config(hpl_env)
    target = data.prepare(cfg)
    prepared, tokenizer = data.training_inputs(cfg)
    assert tokenizer.name_or_path == cfg.paths.model_dir
    assert not any(path.name.startswith(".") for path in target.parent.iterdir()), "no partial folder is left"
    assert (len(prepared["train"]), len(prepared["validation"])) == (180, 20)
    report = json.loads((target / "stats.json").read_text())
    assert report["examples"] == 180 and report["max_length"] == 128
    padded, packed = report["padded_to_max_length"], report["packed"]
    assert 0 <= packed["pad_fraction"] < padded["pad_fraction"] < 1
    assert packed["sequences"] < padded["sequences"]
    assert packed["optimizer_steps_per_epoch"] < padded["optimizer_steps_per_epoch"]
    out = capsys.readouterr().out
    assert f"{padded['pad_fraction']:.1%} padded to max_length" in out and f"{packed['pad_fraction']:.1%} packed" in out


def test_the_train_step_refuses_missing_or_stale_data_naming_the_data_step(hpl_env, tmp_path, capsys):
    """The train step only trains: whatever its world size, a missing or stale copy is refused naming the data
    step's command; `train --prepare-data` (one process) runs the data step's preparation first."""
    missing = tiny_config(hpl_env)
    with pytest.raises(StepError, match=r"no prepared data in .*: run the data step first \(python -m llm_pipeline"):
        data.training_inputs(missing)
    data.prepare(missing)
    changed = tiny_config(hpl_env, data={"max_samples": 50, "max_length": 64})
    named = "data.max_length \\(prepared with 128, now 64\\); data.max_samples \\(prepared with 0, now 50\\)"
    with pytest.raises(StepError, match=f"prepared with another {named}: run the data step first"):
        data.training_inputs(changed)
    capsys.readouterr()
    data.prepare_if_stale(changed)
    prepared, _ = data.training_inputs(changed)
    assert len(prepared["train"]) + len(prepared["validation"]) == 50
    assert "preparing it first, as the data step does" in capsys.readouterr().out
    assert data.stale_reason(changed) is None
    # the step's CLI: one error line, exit 2, before any model is loaded
    stale = write_config(tmp_path / "stale.toml", hpl_env, data={"max_length": 96})
    assert train.main(["--config", str(stale)]) == 2
    assert "run the data step first" in capsys.readouterr().err


def test_the_train_step_reads_the_data_steps_copy_without_preparing_it_again(hpl_env, capsys):
    cfg = tiny_config(hpl_env)
    target = data.prepare(cfg)
    written = {path.name: path.stat().st_mtime_ns for path in target.iterdir()}
    capsys.readouterr()
    prepared, _ = data.training_inputs(cfg)
    assert len(prepared["train"]) == 180
    out = capsys.readouterr().out
    assert f"using prepared data from {target}" in out and "prepared train" not in out
    assert {path.name: path.stat().st_mtime_ns for path in target.iterdir()} == written


def test_a_changed_tokenizer_or_dataset_file_makes_the_prepared_copy_stale(hpl_env, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_config(hpl_env).paths.model_dir, model)
    rows = tiny.write_dolly_jsonl(tmp_path / "rows.jsonl", 40)
    cfg = tiny_config(hpl_env, paths={"model_dir": str(model)}, data={"dataset": str(rows)})
    data.prepare(cfg)
    assert data.stale_reason(cfg) is None
    config_file = model / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"clean_up_tokenization_spaces": True}))
    assert "prepared with another tokenizer (the tokenizer files in paths.model_dir differ)" in data.stale_reason(cfg)
    data.prepare(cfg)
    tiny.write_dolly_jsonl(rows, 40)  # the same rows written again: a rewrite is noticed by its time
    assert data.stale_reason(cfg).endswith("prepared with another data.dataset file(s) (written again since)")


def test_data_cli_reports_bad_input_and_exits_2(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, data={"dataset": str(tmp_path / "missing.jsonl")})
    assert data.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: data.dataset")


def test_data_cli_without_tokenizer_names_the_download_step(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, paths={"model_dir": str(tmp_path / "no-model")})
    assert data.main(["--config", str(path)]) == 2
    assert "run the download step" in capsys.readouterr().err


def test_empty_table_is_an_error():
    import datasets

    with pytest.raises(StepError, match="is empty"):
        data.validate(datasets.Dataset.from_dict({"instruction": [], "response": []}), "x")


def test_malformed_file_is_an_error(tmp_path):
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(StepError, match="cannot be read"):
        data.load_source(DataConfig(dataset=str(tmp_path / "bad.jsonl")))


def chat_config(env, folder, records=None, **data_keys):
    """tiny-cpu.toml reading chat-format records (tiny.chat_records unless given) from a JSON-lines file."""
    path = folder / "chat.jsonl"
    if records is None:
        tiny.write_chat_jsonl(path, 24)
    else:
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return tiny_config(env, data={"dataset": str(path), "validation_fraction": 0.0, **data_keys})


def test_chat_records_are_prepared_and_their_padding_counted_through_the_chat_template(hpl_env, tmp_path):
    cfg = chat_config(hpl_env, tmp_path)
    target = data.prepare(cfg)
    prepared, tokenizer = data.training_inputs(cfg)
    assert prepared["train"].column_names == ["messages"]
    assert prepared["train"][0]["messages"] == tiny.chat_records(24)[0]["messages"]
    report = json.loads((target / "stats.json").read_text())
    lengths = [
        len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=False))
        for r in tiny.chat_records(24)
    ]
    assert report["examples"] == 24
    assert report["tokens"] == sum(min(n, cfg.data.max_length) for n in lengths)
    assert report["truncated_examples"] == sum(n > cfg.data.max_length for n in lengths)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "user", "content": "Why?"}], "no assistant turn"),
        ([{"role": "robot", "content": "Why?"}, {"role": "assistant", "content": "Because."}], "role one of"),
    ],
)
def test_malformed_chat_records_are_named(hpl_env, tmp_path, messages, message):
    cfg = chat_config(hpl_env, tmp_path, records=[{"messages": messages}])
    with pytest.raises(StepError, match=f"record 0: .*{message}"):
        data.prepare(cfg)


def test_chat_records_need_a_template_that_marks_the_assistant_turns(hpl_env, tmp_path):
    cfg = chat_config(hpl_env, tmp_path)
    tokenizer = data.load_tokenizer(cfg.paths.model_dir)
    tokenizer.chat_template = tokenizer.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    with pytest.raises(StepError, match=r"data\.completion_only_loss needs .* set data\.completion_only_loss = false"):
        data.prepare(cfg, tokenizer)
    data.prepare(chat_config(hpl_env, tmp_path, completion_only_loss=False), tokenizer)  # every token: no marker needed
    tokenizer.chat_template = None
    with pytest.raises(StepError, match=r"data\.dataset .* has no chat template"):
        data.prepare(cfg, tokenizer)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_mostly_empty_or_missing_responses_are_refused_and_a_few_counted(hpl_env, tmp_path, capsys):
    records = tiny.dolly_records(20)
    empty = [{**r, "response": ""} for r in records[:11]] + [
        {k: v for k, v in r.items() if k != "response"} for r in records[11:]
    ]
    cfg = tiny_config(hpl_env, data={"dataset": str(_jsonl(tmp_path / "empty.jsonl", empty))})
    with pytest.raises(
        StepError, match=r"20 of 20 records have an empty or missing response \(100%; refused above 50%"
    ):
        data.prepare(cfg)
    few = [{**r, "response": "  "} if i < 3 else r for i, r in enumerate(records)]
    data.prepare(tiny_config(hpl_env, data={"dataset": str(_jsonl(tmp_path / "few.jsonl", few))}))
    assert "3 of 20 records have an empty or missing response" in capsys.readouterr().out


def test_prompts_leaving_no_room_for_the_answer_are_refused_with_a_length_that_fits(hpl_env):
    cfg = tiny_config(hpl_env, data={"max_length": 24})
    with pytest.raises(StepError, match=r"data\.max_length 24: \d+ of \d+ prompts fill it") as refused:
        data.prepare(cfg)
    suggested = int(str(refused.value).split("data.max_length ")[2].split(" ")[0])
    report = data.prepare(tiny_config(hpl_env, data={"max_length": suggested})) / DATA_STATS_FILE
    stats = json.loads(report.read_text())
    assert stats["prompts_filling_max_length"] <= 0.1 * stats["examples"]


def test_alpaca_and_csv_records_are_read_as_dolly_records(hpl_env, tmp_path):
    import datasets

    records = tiny.dolly_records(12)
    alpaca = [{"instruction": r["instruction"], "input": r["context"], "output": r["response"]} for r in records]
    csv = tmp_path / "rows.csv"
    datasets.Dataset.from_list(records).to_csv(str(csv))
    for source in (_jsonl(tmp_path / "alpaca.jsonl", alpaca), csv):
        loaded = data.validate(data.load_source(DataConfig(dataset=str(source))), str(source))
        assert loaded.to_list() == [{k: r[k] or "" for k in ("instruction", "context", "response")} for r in records]
