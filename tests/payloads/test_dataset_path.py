"""A relative data.dataset that names a local file resolves against the run config's folder in config.load,
whatever the working folder, so the preview, the data step, the dry run, submit and the rehearsal read the same
file; a Hub id stays a Hub id (docs/custom-data.md: "looks like a file")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llm_pipeline import config, data
from llm_pipeline.jobs.run_config_text import with_keys

TINY = Path(__file__).resolve().parents[2] / "payloads" / "configs" / "tiny-cpu.toml"
ENV = {"HPL_MODELS_DIR": "/m", "HPL_DATASETS_DIR": "/d", "HPL_OUTPUTS_DIR": "/o"}


def run_config(folder: Path, dataset: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my-run.toml"
    path.write_text(with_keys(TINY.read_text(), {("data", "dataset"): dataset}))
    return path


def records(path: Path, instruction: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"instruction": instruction, "context": "", "response": "Yes."}) + "\n")
    return path


@pytest.mark.parametrize("dataset", ["mine.jsonl", "./mine.jsonl", "data/mine.csv", "../shared/mine.parquet"])
def test_a_relative_dataset_resolves_against_the_config_folder_from_any_working_folder(tmp_path, monkeypatch, dataset):
    config_dir = tmp_path / "project" / "configs"
    path = run_config(config_dir, dataset)
    for cwd in (tmp_path, config_dir.parent, Path("/")):
        monkeypatch.chdir(cwd)
        for named in (path, os.path.relpath(path, cwd)):
            assert config.load(named, env=ENV).data.dataset == str(config_dir / dataset)


def test_the_data_step_reads_the_file_beside_the_config_not_one_in_the_working_folder(tmp_path, monkeypatch):
    config_dir = tmp_path / "mydata"
    records(config_dir / "mine.jsonl", "Beside the config.")
    records(tmp_path / "elsewhere" / "mine.jsonl", "In the working folder.")
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = config.load(run_config(config_dir, "mine.jsonl"), env=ENV)
    assert [row["instruction"] for row in data.load_source(cfg.data)] == ["Beside the config."]


def test_a_folder_beside_the_config_is_local_even_without_a_suffix(tmp_path):
    (tmp_path / "records").mkdir()
    assert config.load(run_config(tmp_path, "records"), env=ENV).data.dataset == str(tmp_path / "records")


@pytest.mark.parametrize(
    ("dataset", "loaded"),
    [
        ("databricks/databricks-dolly-15k", "databricks/databricks-dolly-15k"),  # a Hub id
        ("imdb", "imdb"),
        ("${HPL_DATASETS_DIR}/dolly.jsonl", "/d/dolly.jsonl"),  # the cluster's datasets folder
        ("/data/abs.jsonl", "/data/abs.jsonl"),
        ("~/mine.jsonl", "~/mine.jsonl"),  # the data step expands it where it runs
    ],
)
def test_a_hub_id_an_absolute_and_a_home_path_are_left_as_they_are(tmp_path, monkeypatch, dataset, loaded):
    (tmp_path / "elsewhere" / "imdb").mkdir(parents=True)  # a folder of that name in the working folder: not read
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert config.load(run_config(tmp_path / "configs", dataset), env=ENV).data.dataset == loaded
