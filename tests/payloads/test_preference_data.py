"""train.objective dpo's records: the forms accepted (text, dolly, chat, whole conversations), each bad record
refused in one line naming the file, the record and its line, and the field; the preview and the report."""

from __future__ import annotations

import json

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import config, data
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import format_prompt
from tools import tiny_model as tiny

# The main stack only: DPO runs on the torch engine, and the neuron backend (the trn1 image) refuses it at load.
GOOD = {"prompt": "Why?", "chosen": "Because llamas.", "rejected": "Llamas because."}
TURNS = {
    "prompt": [{"role": "user", "content": "Why?"}],
    "chosen": [{"role": "assistant", "content": "Because llamas."}],
    "rejected": [{"role": "assistant", "content": "Llamas because."}],
}


def _cfg(hpl_env, path):
    return tiny_config(
        hpl_env, data={"dataset": str(path), "packing": False, "validation_fraction": 0.0}, train={"objective": "dpo"}
    )


def _write(folder, records):
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({**GOOD, "chosen": ["Because."]}, "field chosen must be text, got list"),
        ({**GOOD, "rejected": "  "}, "field rejected is empty"),
        ({**GOOD, "rejected": GOOD["chosen"]}, "fields chosen and rejected are the same answer"),
        ({**GOOD, "prompt": ""}, "field prompt must be non-empty text"),
    ],
)
def test_a_bad_text_record_is_refused_naming_file_line_and_field(hpl_env, tmp_path, bad, words):
    path = _write(tmp_path, [GOOD, GOOD, bad, GOOD])
    with pytest.raises(StepError) as caught:
        data.prepare(_cfg(hpl_env, path))
    message = str(caught.value)
    assert message.startswith(f"data.dataset {path}, record 2 (line 3): ") and words in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({**TURNS, "chosen": "Because."}, "field chosen must be a list of {role, content} turns"),
        ({**TURNS, "rejected": [{"role": "user", "content": "More?"}]}, "field rejected has no assistant turn"),
        ({**TURNS, "prompt": TURNS["chosen"]}, "field prompt must be a list of turns ending with a user"),
    ],
)
def test_a_bad_chat_record_is_refused_naming_its_field(hpl_env, tmp_path, bad, words):
    path = _write(tmp_path, [TURNS, bad])
    with pytest.raises(StepError, match=r"record 1 \(line 2\): ") as caught:
        data.prepare(_cfg(hpl_env, path))
    assert words in str(caught.value)


def test_missing_answer_columns_are_named(hpl_env, tmp_path):
    path = _write(tmp_path, [{"prompt": "Why?", "response": "Because."}])
    with pytest.raises(StepError, match=r"lacks column\(s\) chosen, rejected \(has: prompt, response\)"):
        data.prepare(_cfg(hpl_env, path))


def test_every_accepted_form_gives_trls_explicit_prompt_pairs(hpl_env, tmp_path, tiny_models_dir):
    tokenizer = data.load_tokenizer(str(tiny_models_dir / "tiny-llama"))
    dolly = {"instruction": "Why?", "context": "Facts.", "chosen": "Because.", "rejected": "No."}
    whole = {
        "chosen": TURNS["prompt"] + TURNS["chosen"],
        "rejected": TURNS["prompt"] + TURNS["rejected"],
    }
    for record, prompt in ((GOOD, "Why?"), (dolly, format_prompt("Why?", "Facts.")), (whole, TURNS["prompt"])):
        cfg = _cfg(hpl_env, _write(tmp_path, [record]))
        (pair,) = data.validated_records(cfg.data, tokenizer, "dpo")
        assert pair["prompt"] == prompt and pair["chosen"] != pair["rejected"]


def test_prepare_reports_pairs_and_a_changed_objective_makes_the_copy_stale(hpl_env, tmp_path, capsys):
    path = tiny.write_preference_jsonl(tmp_path / "pairs.jsonl", 20, chat=True)
    cfg = _cfg(hpl_env, path)
    data.prepare(cfg)
    assert "20 preference pairs" in capsys.readouterr().out
    assert data.stale_reason(cfg) is None
    sft = tiny_config(hpl_env, data={"dataset": str(path), "packing": False, "validation_fraction": 0.0})
    assert "train.objective (prepared for dpo, now sft)" in data.stale_reason(sft)


def test_the_preview_marks_each_answer(hpl_env, tmp_path, capsys):
    path = write_config(
        tmp_path / "run.toml",
        hpl_env,
        data={"dataset": str(tiny.write_preference_jsonl(tmp_path / "p.jsonl", 8)), "packing": False},
        train={"objective": "dpo"},
    )
    assert data.main(["--preview", str(path)]) == 0
    out = capsys.readouterr().out
    assert "prompt (" in out and "chosen (" in out and "rejected (" in out and "[[" in out


def test_dpo_keys_and_refusals_are_one_line_each():
    with pytest.raises(config.ConfigError, match=r'set train.objective = "dpo"'):
        config.from_dict({"train": {"method": "dpo"}})
    with pytest.raises(config.ConfigError, match=r"train.objective: 'dpo' cannot run on the neuron backend"):
        config.from_dict({"train": {"objective": "dpo", "backend": "neuron"}})
    with pytest.raises(config.ConfigError, match=r"data.packing: .*false with train.objective dpo"):
        config.from_dict({"train": {"objective": "dpo", "backend": "torch"}, "data": {"packing": True}})
    with pytest.raises(config.ConfigError, match=r"dpo.beta: invalid value 0.0"):
        config.from_dict({"train": {"objective": "dpo", "backend": "torch"}, "dpo": {"beta": 0}})
    assert "dpo" in config.learning_keys()  # a finished run resubmitted with another beta is refused


def doc_block(text: str, name: str) -> str:
    """The fenced block after docs/training.md's ``<!-- dpo example: NAME -->`` marker."""
    after = text.split(f"<!-- dpo example: {name} -->\n", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def test_the_docs_worked_example_runs_as_written(tmp_path, tiny_models_dir, monkeypatch, capsys):
    """Each step line runs as `python -m llm_pipeline.<step> ARGS` would: the module's main(ARGS), in this process
    (test_step_clis.py proves each step's `python -m` entry; four more interpreters would only re-import torch)."""
    import importlib
    import os
    import shlex
    import subprocess
    from pathlib import Path
    from unittest import mock

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs" / "training.md").read_text()
    (tmp_path / "pairs.jsonl").write_text(doc_block(text, "pairs.jsonl"))
    (tmp_path / "dpo.toml").write_text(doc_block(text, "dpo.toml"))
    models = tmp_path / ".rehearsal" / "fsx" / "models"
    models.mkdir(parents=True)
    (models / "tiny-llama").symlink_to(tiny_models_dir / "tiny-llama")
    monkeypatch.chdir(tmp_path)
    outputs = []
    for line in doc_block(text, "commands").splitlines():
        program, *args = shlex.split(line)
        assert program in ("mkdir", ".venv/bin/python"), line
        if program == "mkdir":  # the shell line stands in the init run's merged model
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            outputs.append(done.stdout)
            continue
        flag, module, *argv = args
        assert flag == "-m" and module.startswith("llm_pipeline."), line
        with mock.patch.dict(os.environ):  # the preview sets the cluster's folder variables it needs
            status = importlib.import_module(module).main(argv)
        captured = capsys.readouterr()
        assert status == 0, captured.err[-2000:]
        outputs.append(captured.out)
    _, preview, trained, _, evaluated = outputs
    assert "[[" in preview and "6 preference pairs" in preview  # 8, 2 of them held out
    assert "reference: the policy with its adapter disabled" in trained and "finished at step 2" in trained
    assert f"evaluating the base model: {tmp_path}/sft/merged" in evaluated
    report = (tmp_path / "dpo-run" / "eval" / "report.md").read_text()
    assert "Held-out preference pairs scored: 2" in report and "DPO reward accuracy" in report, evaluated
