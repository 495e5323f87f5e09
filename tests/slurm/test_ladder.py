"""The torchtitan ladder as one submission under a real local Slurm, in rehearsal form.

The real chain (ladder-*.sbatch, env.sh, launch arguments from the allocation, torchrun with two
processes) runs tiny-ladder-cpu.toml with three of its rungs (CHAIN_RUNGS): prepare (with the storage
check), tokenizer, dataset (a tiny c4-format folder staged), each rung's job file checked by torchtitan's
ConfigManager; the trainer itself needs CUDA, so HPL_TORCHTITAN_MODULE swaps in
tools/torchtitan_standin.py, which trains torchtitan's debug model with torchtitan's parts on CPU
(FSDP2, float8 emulated), saves its checkpoints and prints torchtitan's metric lines; the report step
parses them, and the export converts the fp8_allgather rung's final checkpoint into a Hugging Face folder.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import tomllib
from slurm_helpers import REPO, read_png, submit

from llm_pipeline import charts, config
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.ladder_submit import resumed_rungs
from llm_pipeline.run_files import StepMarker, SubmittedLine, TitanMetricLine
from tools.rehearse import fsx_environment
from tools.rehearse_ladder import ladder_environment, write_dataset_source, write_tokenizer

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-ladder")]
CONFIGS = REPO / "payloads" / "configs"
TINY_LADDER = CONFIGS / "tiny-ladder-cpu.toml"
SHARED = ["prepare", "tokenizer", "dataset"]  # once: their output serves the smoke run and the long one
# The chain test's ladder: the rehearsal's without fp8, as each rung costs two torchrun starts (smoke and long)
# and fp8 adds no path of its own. baseline: the reference row and a plain-weights resume; compile: trains as the
# baseline in the stand-in, the uninterrupted run that resume is compared with; fp8_allgather: the float8 linears
# (fp8's options, rung_options climbs), the float8 all-gather resume and the export. Every rung's job file, fp8's
# included, goes through torchtitan's ConfigManager in tests/payloads/test_torchtitan_ladder.py.
CHAIN_RUNGS = ("baseline", "compile", "fp8_allgather")


def ladder_steps(rungs: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    """The long jobs, the rungs whose smoke run also resumes, and the whole chain in order, for ``rungs``."""
    long = [*(f"rung-{r}" for r in rungs), "report", "export"]
    resumed = [f"rung-{rung}" for rung in resumed_rungs(rungs)]  # baseline, fp8_allgather
    smoke = [f"smoke-{name}" for step in long for name in ((step, f"{step}-resume") if step in resumed else (step,))]
    return long, resumed, [*SHARED, *smoke, "estimate", *long]


LONG, RESUMED, CHAIN_STEPS = ladder_steps(CHAIN_RUNGS)
LADDER_STEPS = ladder_steps(config.TORCHTITAN_RUNGS)[2]  # the default ladder's chain


def submitted_jobs(stdout: str) -> dict[str, str]:
    return SubmittedLine.jobs(stdout)


def test_ladder_chain_runs_every_rung_and_reports_torchtitans_metrics(one_node, tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    env = ladder_environment(one_node.env(fsx_environment(root / "fsx")))  # what make rehearse-ladder runs
    ladder_config = write_derived(TINY_LADDER, root / "ladder.toml", {("torchtitan", "rungs"): list(CHAIN_RUNGS)})
    cfg = config.load(ladder_config, env=env)
    assert cfg.torchtitan.rungs == CHAIN_RUNGS
    write_tokenizer(ladder_config, env)  # the tokenizer step finds it there and skips the Hub
    write_dataset_source(ladder_config, env)  # what the dataset step stages (allenai/c4 on a cluster)
    run = Path(cfg.paths.output_dir)

    result = submit(env, ladder_config, "ladder", "--wait", "--poll", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = submitted_jobs(result.stdout)
    assert list(jobs) == CHAIN_STEPS and "pipeline: COMPLETED" in result.stdout
    logs = {
        step: (run / ("smoke/logs" if step.startswith("smoke-") else "logs") / f"{step}-{job}.log").read_text()
        for step, job in jobs.items()
    }
    assert "run config ok" in logs["prepare"] and "already holds the tokenizer" in logs["tokenizer"]
    assert "storage: 0.01B parameters; per rung: baseline" in logs["prepare"]
    assert "staged 3 data files" in logs["dataset"] and "first record:" in logs["dataset"]
    for rung in CHAIN_RUNGS:
        log = logs[f"rung-{rung}"]
        job_file = run / "ladder" / rung / "job.toml"
        assert f"torchtitan job file {job_file}" in log and f"torchtitan's ConfigManager accepts {job_file}" in log
        assert tomllib.loads(job_file.read_text())["training"]["dataset_path"] == cfg.torchtitan.dataset_dir
        assert "--nproc_per_node=2" in log and f"--job.config_file {job_file}" in log
        assert f"== rung-{rung}: COMPLETED (exit 0)" in log
        # checkpoint_retention "last": the interval save at step 10 went, the final step stayed
        assert [p.name for p in (run / "ladder" / rung / "checkpoint").iterdir()] == ["step-20"]

    report = json.loads((run / "ladder" / "report.json").read_text())
    rows = {row["rung"]: row for row in report["rungs"]}
    assert list(rows) == list(CHAIN_RUNGS)
    for row in rows.values():
        measured = row["measured"]
        assert measured["ranks"] == 2 and measured["last_step"] == 20 and measured["tps"] > 0
        assert measured["steady_steps"] == [5, 10, 15, 20]  # log_freq 5: step 1 is warm-up
    assert rows["baseline"]["tps_vs_baseline"] == 1.0
    fp8 = rows["fp8_allgather"]
    assert fp8["tps_vs_baseline"] == fp8["measured"]["tps"] / rows["baseline"]["measured"]["tps"]
    markdown = (run / "ladder" / "report.md").read_text()
    read_png(run / "ladder" / "report.png")  # drawn by the report step from report.json, whose figures it plots:
    (axis,) = charts.ladder_figure(report).axes
    measured = [round(bar.get_height(), 3) for bar in axis.patches[: len(rows)]]
    assert measured == [round(row["measured"]["tps"], 3) for row in rows.values()]
    assert "| + FP8 all-gather, precomputed scales |" in markdown and "8,950" in markdown  # its reference tps
    hf_dir = run / "hf"
    assert f"Hugging Face folder ready: {hf_dir}" in logs["export"]
    exported = json.loads((hf_dir / "config.json").read_text())
    assert (exported["hidden_size"], exported["vocab_size"]) == (256, 2048)  # torchtitan's debugmodel
    assert any(path.suffix == ".safetensors" for path in hf_dir.iterdir()) and not (hf_dir / "sharded").exists()

    # Before the first long rung: every rung's smoke run (4 steps, a metric line each), its report, its
    # export step, and the estimate from the smoke rungs' logged step times.
    smoke_report = json.loads((run / "smoke" / "ladder" / "report.json").read_text())
    for row in smoke_report["rungs"]:  # a resumed rung's report reads the resumed job's log: steps 3 and 4
        steady = [3, 4] if f"rung-{row['rung']}" in RESUMED else [2, 3, 4]
        assert row["measured"]["last_step"] == 4 and row["measured"]["steady_steps"] == steady
    # One rung per checkpoint format stops after its full save at step 2 (the 4-step schedule kept), and a
    # second job resumes from it through torchtitan's CheckpointManager: plain weights, then float8 all-gather ones.
    for step in RESUMED:
        checkpoint = run / "smoke" / "ladder" / step.removeprefix("rung-") / "checkpoint"
        saving, resumed = logs[f"smoke-{step}"], logs[f"smoke-{step}-resume"]
        assert ", 2 steps, rank 0 of 2" in saving and "Saving a full checkpoint at last step, step 2" in saving
        assert "torchtitan resumes from the newest checkpoint" in resumed
        assert f"Loading the checkpoint from {checkpoint}/step-2" in resumed and "Training starts at step 3" in resumed

    # The stand-in trains with compile off on CPU, so the compile rung trains exactly as the baseline: the compile
    # rung's uninterrupted smoke run logs the losses of steps 3 and 4 that the baseline's resumed job must log
    # (the same schedule, optimizer state and data position after the resume).
    def late_losses(log: str) -> list[tuple[int, float]]:
        return [(line.step, line.loss) for line in TitanMetricLine.parse_all(log) if line.step in (3, 4)]

    resumed_losses = late_losses(logs["smoke-rung-baseline-resume"])
    assert len(resumed_losses) == 4 and resumed_losses == late_losses(logs["smoke-rung-compile"])
    job_file = tomllib.loads((run / "smoke" / "ladder" / "baseline" / "job.toml").read_text())
    assert job_file["checkpoint"]["interval"] == 2 and job_file["training"]["steps"] == 4
    found = json.loads((run / "logs" / "estimate.json").read_text())
    assert [row["step"] for row in found["steps"]] == LONG
    for rung in CHAIN_RUNGS:
        assert (
            f"20 steps (torchtitan.steps) x {found['seconds_per_step'][f'rung-{rung}']:.3f} s/step"
            in (found["steps"][LONG.index(f"rung-{rung}")]["basis"])
        )
    first_long = StepMarker.from_json((run / "logs" / "state" / "rung-baseline.json").read_text())
    assert StepMarker.from_json((run / "logs" / "state" / "estimate.json").read_text()).time <= first_long.time
    # status on this finished chain with its smoke stage: every step completed, and the smoke run's estimate (the
    # suite's one `submit status` of such a chain; the default chain's --wait shows it in the newcomer journey)
    status = submit(env, ladder_config, "status")
    assert status.returncode == 0 and "pipeline: COMPLETED" in status.stdout, status.stdout + status.stderr
    assert f"estimate from the smoke run ({run / 'logs' / 'estimate.json'}):" in status.stdout
    for step in CHAIN_STEPS:
        assert re.search(rf"(?m)^{re.escape(step)} +{jobs[step]} +COMPLETED", status.stdout), step


def test_ladder_dry_run_chains_the_rungs_on_every_node(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HPL_OUTPUTS_DIR": str(tmp_path), "HPL_MODELS_DIR": str(tmp_path)}
    result = submit(env, CONFIGS / "llama3-8b-pretrain.toml", "ladder", "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "sbatch" in line]
    assert [re.match(r"(\w+)_job=", line).group(1) for line in lines] == [s.replace("-", "_") for s in LADDER_STEPS]
    for line, step in zip(lines, LADDER_STEPS, strict=True):
        words = shlex.split(line.split("=$(", 1)[1].rstrip(")"))
        assert f"--nodes={4 if 'rung-' in step else 1}" in words
        assert ('--dependency=afterok:"$' in line) == (step != "prepare")
    assert lines[LADDER_STEPS.index("smoke-rung-compile")].endswith("ladder-rung.sbatch compile)")
    saving, resumed = (lines[LADDER_STEPS.index(f"smoke-rung-fp8_allgather{end}")] for end in ("", "-resume"))
    assert "/smoke/save.toml," in saving and "/smoke/run.toml," in resumed  # stop after step 2, then go on
    assert resumed.endswith("ladder-rung.sbatch fp8_allgather)")


def test_rung_list_is_the_loaded_run_configs(tmp_path):
    """The controller loads the run config (config.load, with or without tomllib): its rungs and their rules."""
    path = tmp_path / "run.toml"
    path.write_text('[torchtitan]\nrungs = ["baseline", "fp8"]  # two\n')
    assert read_run_facts(path, {}).run.torchtitan.rungs == ("baseline", "fp8")
    path.write_text("[paths]\noutput_dir = '/x'\n")
    assert read_run_facts(path, {}).run.torchtitan.rungs == config.TORCHTITAN_RUNGS
    for bad in ('rungs = ["baseline", "fp16"]', 'rungs = ["compile", "compile"]', "rungs = []"):
        path.write_text(f"[torchtitan]\n{bad}\n")
        with pytest.raises(config.ConfigError, match=r"torchtitan\.rungs"):
            read_run_facts(path, {})


@pytest.mark.parametrize(
    ("step", "offline"),
    [
        ("prepare", ""),
        ("tokenizer", ""),
        ("dataset", ""),
        ("rung-baseline", ""),
        ("rung-fp8_allgather", ""),
        ("report", "1"),
    ],
)
def test_rungs_may_stream_c4_from_the_hub_and_the_report_stays_offline(tmp_path, step, offline):
    env = {
        "PATH": "/usr/bin:/bin",
        "HPL_PAYLOADS_DIR": str(REPO / "payloads"),
        "HPL_RUN_CONFIG": str(TINY_LADDER),
        "HPL_RUN_DIR": str(tmp_path),
    }
    script = f'source "$HPL_PAYLOADS_DIR/slurm/env.sh" {step} && echo "OFFLINE=${{HF_HUB_OFFLINE:-}}."'
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"OFFLINE={offline}." in out.stdout.splitlines()
