"""Each step is a command: `python -m llm_pipeline.<step>` with --help, and `error: ...` + exit 2 on bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAYLOADS = Path(__file__).resolve().parents[2] / "payloads"
STEPS = ("download", "data", "train", "generate", "evaluate")


def _run(*args: str, cwd: Path = PAYLOADS) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PAYLOADS)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("step", STEPS)
def test_help(step):
    result = _run(f"llm_pipeline.{step}", "--help")
    assert result.returncode == 0
    assert f"usage: python -m llm_pipeline.{step}" in result.stdout and "--config" in result.stdout


def test_bad_config_is_one_error_line_and_exit_2(tmp_path):
    (tmp_path / "run.toml").write_text("[lora]\nr = 0\n")
    result = _run("llm_pipeline.train", "--config", str(tmp_path / "run.toml"))
    assert result.returncode == 2
    assert result.stderr.strip() == "error: lora.r: invalid value 0 (allowed: > 0)"


def test_missing_config_file_and_missing_option(tmp_path):
    result = _run("llm_pipeline.generate", "--config", str(tmp_path / "absent.toml"))
    assert (result.returncode, result.stderr.strip()) == (
        2,
        f"error: run config {tmp_path / 'absent.toml'} does not exist",
    )
    result = _run("llm_pipeline.data")
    assert result.returncode == 2 and "one of the arguments --config --preview is required" in result.stderr


def test_train_help_and_docstring_name_every_method_and_backend():
    from llm_pipeline import train
    from llm_pipeline.config import BACKENDS, METHODS

    for text in (train.build_parser().format_help(), train.__doc__):
        words = set(re.findall(r"[a-z]+", text))
        assert not [name for name in (*METHODS, *BACKENDS) if name not in words], text


def test_evaluate_without_prepared_data_names_the_data_step(tmp_path):
    (tmp_path / "run.toml").write_text(f'[paths]\noutput_dir = "{tmp_path / "run"}"\nmodel_dir = "{tmp_path}"\n')
    result = _run("llm_pipeline.evaluate", "--config", str(tmp_path / "run.toml"))
    assert (result.returncode, result.stderr.strip()) == (
        2,
        f"error: no prepared data in {tmp_path / 'run' / 'data'}: run the data step first",
    )


def test_an_adapter_step_logs_no_hub_kernel_warning_from_bitsandbytes():
    """peft imports bitsandbytes, which on an AVX512-BF16 CPU without the Hub warns about a kernel it could not fetch
    (on a CPU without that flag bitsandbytes never tries, and this test cannot tell)."""
    code = "import llm_pipeline.cli, peft"
    env = {**os.environ, "PYTHONPATH": str(PAYLOADS), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kernels-community" not in done.stderr
