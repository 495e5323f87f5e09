"""Fixtures for the training payload tests: a tiny random Llama and dolly records, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import tiny_model as tiny


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory) -> Path:
    """HPL_MODELS_DIR holding tiny-llama/ (fp32 safetensors + tokenizer); read-only for tests."""
    models = tmp_path_factory.mktemp("models")
    tiny.write_tiny_model(models / "tiny-llama")
    return models


@pytest.fixture(scope="session")
def tiny_datasets_dir(tmp_path_factory) -> Path:
    """HPL_DATASETS_DIR holding tiny-dolly.jsonl (200 records)."""
    datasets = tmp_path_factory.mktemp("datasets")
    tiny.write_dolly_jsonl(datasets / "tiny-dolly.jsonl", 200)
    return datasets


@pytest.fixture
def hpl_env(tmp_path, tiny_models_dir, tiny_datasets_dir) -> dict[str, str]:
    """The HPL_* variables the tiny run config reads, with a fresh outputs folder per test."""
    return {
        "HPL_MODELS_DIR": str(tiny_models_dir),
        "HPL_DATASETS_DIR": str(tiny_datasets_dir),
        "HPL_OUTPUTS_DIR": str(tmp_path / "outputs"),
    }


@pytest.fixture(scope="session")
def precision_runs(tmp_path_factory, tiny_models_dir, tiny_datasets_dir) -> dict[int, dict[str, dict]]:
    """ranks -> method -> what the torch engine probe measured with the production precision (bf16, FSDP2), for 1
    process and 2 ranks, one launch each (test_train_precision.py; test_liger_fsdp.py's runs without liger)."""
    from engine_launch import PRECISION_METHODS, run_engine, write_precision_run
    from payload_configs import folder_env

    folder = tmp_path_factory.mktemp("precision")
    env = folder_env(folder, tiny_models_dir, tiny_datasets_dir)
    answer = {}
    for ranks in (1, 2):
        runs = [write_precision_run(folder, env, method, ranks) for method in PRECISION_METHODS]
        measured = run_engine(runs, folder / f"ranks-{ranks}.json", ranks=ranks)
        answer[ranks] = {stem.rsplit("-", 1)[0]: value for stem, value in measured.items()}
    return answer
