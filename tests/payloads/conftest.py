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
