"""`python -m llm_pipeline.config_show RUN.toml` and `--version` on the steps."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from payload_configs import CONFIGS, TINY_TOML

import llm_pipeline
from llm_pipeline import config
from llm_pipeline.jobs.run_config_text import write_derived

ROOT = Path(__file__).resolve().parents[2]
ENV = {"HPL_MODELS_DIR": "/models", "HPL_DATASETS_DIR": "/datasets", "HPL_OUTPUTS_DIR": "/outputs"}


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT
    )


def test_show_prints_the_resolved_config_that_loads_back_to_the_same_config():
    shown = run_module("llm_pipeline.config_show", str(TINY_TOML), env=ENV)
    assert shown.returncode == 0, shown.stderr
    assert config.from_dict(tomllib.loads(shown.stdout), env={}) == config.load(TINY_TOML, env=ENV)
    lines = shown.stdout.splitlines()
    assert 'model_dir = "/models/tiny-llama"' in lines, "paths are resolved"
    assert "temperature = 0.0  # default" in lines, "a key the file leaves out shows its default, marked"
    written = tomllib.loads(TINY_TOML.read_text())["train"]
    assert any(line.startswith(f"max_steps = {written['max_steps']}") and "default" not in line for line in lines)


def test_show_applies_derived_defaults(tmp_path):
    keys = {("train", "gradient_checkpointing"): None, ("train", "method"): "full"}  # None: the line removed
    path = write_derived(CONFIGS / "default.toml", tmp_path / "full.toml", keys)
    shown = run_module("llm_pipeline.config_show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "gradient_checkpointing = true  # default" in shown.stdout.splitlines()


def test_show_stops_on_a_bad_config_with_one_error_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nmethod = 'lorax'\n")
    shown = run_module("llm_pipeline.config_show", str(path))
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.startswith("error: ") and "train.method" in shown.stderr and shown.stderr.count("\n") == 1


@pytest.mark.parametrize("step", ["config_show", "prepare", "merge", "submit", "sweep"])
def test_every_step_prints_the_project_version(step):
    done = run_module(f"llm_pipeline.{step}", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"llm_pipeline.{step} {llm_pipeline.__version__}")


def test_the_payload_version_is_the_project_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert llm_pipeline.__version__ == project


def test_config_and_config_show_import_in_one_direction():
    """config_show reads config; config.py, which every side imports, never reaches back."""
    source = (ROOT / "payloads" / "llm_pipeline" / "config.py").read_text()
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name and name.endswith("config_show") for name in imported)
    assert "llm_pipeline.config" in (ROOT / "payloads" / "llm_pipeline" / "config_show.py").read_text()
