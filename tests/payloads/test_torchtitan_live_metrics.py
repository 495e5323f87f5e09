"""torchtitan's metric lines reach node exporter's textfile folder while the trainer runs.

A stand-in trainer module calls torchtitan 0.2.2's own init_logger (which clears the root logger's
handlers) and logs two metric lines in MetricsProcessor.log's format with its colours on; it runs under
live_metrics as torchrun would start rank 0. The .prom file must hold the second line's figures, with
tokens/s over the world and the ETA from the pace between the lines, and the log lines must be unchanged.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from torchtitan_site import site_env

from llm_pipeline.run_files import MetricsTextfile

pytestmark = pytest.mark.engine

TRAINER = """
import sys, time
from torchtitan.tools.logging import init_logger, logger
from torchtitan.tools.utils import Color
init_logger()
c = Color()
for step, loss in ((10, 9.5), (20, 8.25)):
    logger.info(f"{c.red}step: {step:2}  {c.green}loss: {loss:8.5f}  {c.orange}grad_norm:  1.2000  "
                f"{c.turquoise}memory:  1.00GiB(1.00%)  {c.blue}tps: 1,500  {c.cyan}tflops: 1.00  "
                f"{c.magenta}mfu: 12.50%{c.reset}")
    time.sleep(0.5)
print("arguments", sys.argv[1:])
"""


def test_metric_lines_are_published_and_passed_on(tmp_path):
    job = tmp_path / "runs" / "titan-run" / "ladder" / "baseline" / "job.toml"
    job.parent.mkdir(parents=True)
    job.write_text("[training]\nsteps = 100\n")
    (tmp_path / "fake_trainer.py").write_text(TRAINER)
    folder = tmp_path / "textfile"
    folder.mkdir()
    env = site_env()
    env.update(
        PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}", HPL_METRICS_TEXTFILE_PATH=str(folder), SLURM_JOB_ID="77",
        RANK="0", WORLD_SIZE="8",
    )  # fmt: skip
    command = [sys.executable, "-m", "llm_pipeline.training.torchtitan.live_metrics", "fake_trainer"]
    out = subprocess.run(
        [*command, "--job.config_file", str(job)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count(" - root - INFO - ") == 2 and "loss:  8.25000" in out.stdout
    assert f"arguments ['--job.config_file', '{job}']" in out.stdout
    series = {
        sample.name: (sample.labels, sample.value)
        for sample in MetricsTextfile.parse((folder / "hpl_run_77.prom").read_text()).samples
    }
    labels = (("run", "titan-run"), ("slurm_job_id", "77"))
    assert {name: value for name, (_, value) in series.items() if name != "hpl_train_eta_seconds"} == {
        "hpl_train_loss": 8.25,
        "hpl_train_tokens_per_second": 12000.0,
        "hpl_train_mfu_ratio": 0.125,
        "hpl_train_step": 20.0,
        "hpl_train_max_steps": 100.0,
        "hpl_train_last_update_timestamp_seconds": series["hpl_train_last_update_timestamp_seconds"][1],
    }
    assert all(found == labels for found, _ in series.values())
    assert 80 * 0.04 < series["hpl_train_eta_seconds"][1] < 80 * 0.2  # 80 steps left at about 0.05 s a step


def test_other_ranks_publish_nothing(tmp_path):
    folder = tmp_path / "textfile"
    folder.mkdir()
    env = {"RANK": "3", "HPL_METRICS_TEXTFILE_PATH": str(folder)}
    from llm_pipeline.training.torchtitan import live_metrics

    assert live_metrics.install(["--job.config_file", "missing.toml"], env) is None
