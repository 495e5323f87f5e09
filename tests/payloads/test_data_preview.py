"""`python -m llm_pipeline.data --preview CONFIG`: the first training record as trl prepares it for the
torch engine, trained span marked, on the tiny tokenizer."""

from __future__ import annotations

import json

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import data
from llm_pipeline.training.torch import preview
from tools import tiny_model as tiny


def spans(text: str) -> list[str]:
    """The texts between [[ and ]]."""
    return [part.split(preview.CLOSE)[0] for part in text.split(preview.OPEN)[1:]]


def test_a_dolly_record_trains_on_its_response_only(hpl_env, tmp_path, capsys):
    records = tiny.dolly_records(8)
    path = tmp_path / "dolly.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    config = write_config(
        tmp_path / "run.toml", hpl_env, data={"dataset": str(path), "validation_fraction": 0.0, "max_length": 512}
    )
    assert data.main(["--preview", str(config)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "%|" not in captured.err  # no `datasets` progress bar per map and filter: the record is the news
    tokenizer = data.load_tokenizer(tiny_config(hpl_env).paths.model_dir)
    response = tokenizer(records[0]["response"].strip() + tokenizer.eos_token, add_special_tokens=False)
    assert spans(out) == [tokenizer.decode(response["input_ids"])]
    assert out.split(preview.OPEN)[0].rstrip().endswith("Answer")  # the prompt is shown, untrained
    assert "padded to max_length" in out and "packing is" in out


def test_help_names_preview_and_any_dataset(capsys):
    with pytest.raises(SystemExit):
        data.main(["--help"])
    usage = capsys.readouterr().out
    assert "--preview RUN.toml" in usage and "writes nothing" in usage
    assert "dolly dataset" not in usage


def test_a_chat_record_trains_on_the_assistant_turns(hpl_env, tmp_path, capsys):
    cfg = tiny_config(hpl_env)
    path = tiny.write_chat_jsonl(tmp_path / "chat.jsonl", 4)
    config = write_config(
        tmp_path / "run.toml", hpl_env, data={"dataset": str(path), "validation_fraction": 0.0, "max_length": 512}
    )
    assert data.main(["--preview", str(config)]) == 0
    out = capsys.readouterr().out
    answers = [turn["content"] for turn in tiny.chat_records(4)[0]["messages"] if turn["role"] == "assistant"]
    marked = spans(out)
    assert len(marked) == len(answers)
    tokenizer = data.load_tokenizer(cfg.paths.model_dir)
    for span, answer in zip(marked, answers, strict=True):
        assert span.startswith(tokenizer.decode(tokenizer(answer, add_special_tokens=False)["input_ids"]))


def test_a_record_cut_to_nothing_trained_is_said_to_be_dropped(hpl_env):
    cfg = tiny_config(hpl_env, data={"max_length": 40, "validation_fraction": 0.0})
    tokenizer = data.load_tokenizer(cfg.paths.model_dir)
    records = data.validated_records(cfg.data, tokenizer)
    assert preview.prepared_example(cfg, records.select([0]), tokenizer) is None
    assert preview.describe(None, tokenizer, 40).startswith("the trainer drops this record")


def test_on_a_laptop_the_page_s_config_previews_with_a_named_tokenizer(hpl_env, tmp_path, monkeypatch, capsys):
    """docs/custom-data.md's my-run.toml: ${HPL_OUTPUTS_DIR} unset here (the cluster's value stands in, said in
    one note) and no model folder here: the error names --tokenizer, which reads a local one."""
    monkeypatch.delenv("HPL_OUTPUTS_DIR", raising=False)
    (tmp_path / "my-records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tiny.dolly_records(8)))
    config = tmp_path / "my-run.toml"
    config.write_text(
        f'[data]\ndataset = "{tmp_path}/my-records.jsonl"\n[paths]\noutput_dir = "${{HPL_OUTPUTS_DIR}}/my-run"\n'
        f'model_dir = "{tmp_path}/no-model-here"\n'
    )
    assert data.main(["--preview", str(config)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "note: not set on this machine, the cluster's value stands in: HPL_OUTPUTS_DIR=/fsx/outputs"
    assert err[1].startswith(f"error: paths.model_dir {tmp_path}/no-model-here does not exist here") and (
        "--tokenizer DIR" in err[1]
    )
    tokenizer = tiny_config(hpl_env).paths.model_dir
    assert data.main(["--preview", str(config), "--tokenizer", tokenizer]) == 0
    assert "first training record of" in capsys.readouterr().out
