"""Pretraining ladder steps around torchtitan 0.2.2 (submitted by `python3 -m llm_pipeline.submit ladder`).

    python -m llm_pipeline.pretrain tokenizer --config RUN.toml     tokenizer + config files into paths.model_dir
    python -m llm_pipeline.pretrain dataset --config RUN.toml       torchtitan.dataset_source -> dataset_dir (once)
    python -m llm_pipeline.pretrain job --config RUN.toml --rung R  write <run>/ladder/<R>/job.toml
    python -m llm_pipeline.pretrain retain --config RUN.toml --rung R  after the rung: checkpoint retention
    python -m llm_pipeline.pretrain report --config RUN.toml        <run>/ladder/report.md + report.json
    python -m llm_pipeline.pretrain export --config RUN.toml        last rung's final checkpoint -> <run>/hf

Between `job` and `report`, each rung runs torchtitan itself (`python -m torchtitan.train
--job.config_file <run>/ladder/<rung>/job.toml`) under torchrun on every node (slurm/ladder-rung.sbatch).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llm_pipeline import cli, download
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import pipeline_status, smoke
from llm_pipeline.run_files import StepLog
from llm_pipeline.training.torchtitan import ladder as torchtitan_ladder
from llm_pipeline.training.torchtitan import metrics as torchtitan_metrics
from llm_pipeline.training.torchtitan import report as ladder_report
from llm_pipeline.training.torchtitan import storage

# What torchtitan's tokenizer reads (tokenizer.json, tokenizer_config.json) and what a Hugging Face
# export folder needs beside the weights; no weights: the ladder trains from scratch.
ASSET_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
)
REQUIRED_ASSETS = ("tokenizer.json", "tokenizer_config.json")


def fetch_tokenizer(cfg: RunConfig, endpoint: str | None = None) -> Path:
    """The (gated) tokenizer and config files of model.id into paths.model_dir, with the user's token."""
    folder = Path(cfg.paths.model_dir)
    if all((folder / name).is_file() for name in REQUIRED_ASSETS):
        print(f"{folder} already holds the tokenizer of {cfg.model.id}; nothing to download", flush=True)
        return folder
    from huggingface_hub import HfApi, snapshot_download

    token = download.find_token()
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now, not at import (mirrors, tests)
    try:
        info = HfApi(endpoint=endpoint).model_info(cfg.model.id, revision=cfg.model.revision, token=token)
        download.check_access(cfg.model.id, info.gated, token)
        print(f"downloading the tokenizer and config of {cfg.model.id}@{cfg.model.revision} into {folder}", flush=True)
        snapshot_download(
            cfg.model.id,
            revision=cfg.model.revision,
            local_dir=folder,
            allow_patterns=list(ASSET_FILES),
            token=token,
            endpoint=endpoint,
        )
    except StepError:
        raise
    except Exception as exc:  # the Hub's errors become one clear line (download.explain names the fix)
        raise download.explain(exc, cfg.model.id, cfg.model.revision, token) from None
    missing = [name for name in REQUIRED_ASSETS if not (folder / name).is_file()]
    if missing:
        raise StepError(f"{cfg.model.id} has no {', '.join(missing)} on the Hub: torchtitan's tokenizer needs them")
    return folder


SKIP_MARKER = "skip"  # <run>/ladder/<rung>/skip: ladder-rung.sbatch does not start the trainer


def write_job(cfg: RunConfig, rung: str) -> Path:
    """Write the rung's job file, or, when a resubmitted rung already finished with the same job
    file, leave the skip marker instead: its checkpoints and its earlier log stand."""
    if rung not in cfg.torchtitan.rungs:
        raise StepError(f"rung {rung!r} is not in torchtitan.rungs ({', '.join(cfg.torchtitan.rungs)})")
    folder = torchtitan_ladder.rung_dir(cfg, rung)
    skip = folder / SKIP_MARKER
    skip.unlink(missing_ok=True)
    state = torchtitan_ladder.rung_state(cfg, rung)
    checkpoints = folder / "checkpoint"
    if state == "changed":
        # Its last save holds the model only, and other settings should not resume it either.
        raise StepError(
            f"rung {rung} has checkpoints in {checkpoints} from a different job file: remove that folder "
            "to train the rung again with the new settings, or restore the old settings"
        )
    if state == "finished":
        skip.write_text(f"step {cfg.torchtitan.steps} saved in {checkpoints}\n")
        print(
            f"rung {rung} finished earlier with this job file (step {cfg.torchtitan.steps} saved): not trained again; "
            f"the report reads its earlier log. Remove {checkpoints} to train it again.",
            flush=True,
        )
        return folder / "job.toml"
    path = torchtitan_ladder.write_job_file(cfg, rung)
    print(f"rung {rung}: {torchtitan_ladder.RUNG_TITLES[rung]}; torchtitan job file {path}", flush=True)
    if state == "resume":
        print(f"rung {rung}: torchtitan resumes from the newest checkpoint in {checkpoints}", flush=True)
    check_with_torchtitan(path, cfg)
    return path


def check_with_torchtitan(path: Path, cfg: RunConfig) -> None:
    """Parse the job file with torchtitan's ConfigManager now, so a misspelt key stops one process
    here rather than every rank of every node after torchrun started them."""
    try:
        from torchtitan.config import ConfigManager
    except ImportError:
        print("torchtitan is not importable here: torchtitan.train checks the job file when it starts", flush=True)
        return
    try:
        ConfigManager().parse_args(["--job.config_file", str(path)])
    except (ValueError, SystemExit) as exc:
        raise StepError(
            f"torchtitan refuses {path}: {exc}; check {cfg.torchtitan.job_file} and torchtitan.overrides"
        ) from None
    print(f"torchtitan's ConfigManager accepts {path}", flush=True)


def rung_log(cfg: RunConfig, rung: str) -> Path | None:
    """The job log of the newest submission of `rung` (from the submission record); when that one
    holds no metric line (a finished rung skipped on resubmission), the newest log of the rung that does."""
    logs = Path(cfg.paths.logs_dir)
    recorded = [Path(job.log) for job in pipeline_status.read_record(logs) if job.step == f"rung-{rung}"]
    recorded = [path for path in recorded if path.is_file()]
    if recorded and torchtitan_metrics.summarize_file(recorded[-1]):
        return recorded[-1]
    # In the smoke run (<run>/smoke/logs, no record there) the rung's jobs are smoke-rung-<rung> and, for a
    # resumed rung, smoke-rung-<rung>-resume.
    ours = [path for _, path in StepLog.of(logs, lambda step: smoke.long_step(step) == f"rung-{rung}")]
    found = sorted(ours, key=lambda p: p.stat().st_mtime, reverse=True)
    with_metrics = [path for path in found if torchtitan_metrics.summarize_file(path)]
    if with_metrics:
        return with_metrics[0]
    return recorded[-1] if recorded else (found[0] if found else None)


def report(cfg: RunConfig) -> tuple[Path, Path]:
    from llm_pipeline import charts  # matplotlib: only this action draws

    results = []
    for rung in cfg.torchtitan.rungs:
        log = rung_log(cfg, rung)
        summary = torchtitan_metrics.summarize_file(log) if log else None
        results.append(ladder_report.RungResult(rung, log, summary))
        print(
            f"{rung}: "
            + (
                f"{summary.tps:,.0f} tokens/s/GPU, MFU {summary.mfu:.2f} %, loss {summary.final_loss:.4f} "
                f"at step {summary.last_step} ({summary.lines} metric lines in {log})"
                if summary
                else f"no metric lines ({log or 'no log'})"
            ),
            flush=True,
        )
    paths = ladder_report.write(results, cfg.torchtitan.steps, torchtitan_ladder.ladder_dir(cfg))
    chart = charts.ladder_chart(torchtitan_ladder.ladder_dir(cfg))
    print(f"report: {paths[1]} and {paths[0]}; chart: {chart}", flush=True)
    if not any(result.summary for result in results):
        raise StepError(f"no rung logged a torchtitan metric line (logs in {cfg.paths.logs_dir})")
    for result in results:  # checkpoint_retention "none": a rung's checkpoints go once its metrics are read
        if result.summary:
            storage.retain(cfg, result.rung, metrics_read=True)
    return paths


def export(cfg: RunConfig) -> Path:
    from llm_pipeline.training.torchtitan import export as torchtitan_export

    rung = cfg.torchtitan.rungs[-1]
    return torchtitan_export.export(cfg, rung, Path(cfg.paths.output_dir) / "hf")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser("pretrain", "Pretraining ladder steps around torchtitan 0.2.2.")
    parser.add_argument("action", choices=("tokenizer", "dataset", "job", "retain", "report", "export"))
    parser.add_argument("--rung", help="ladder rung (job, retain)")
    return parser


def run(cfg: RunConfig, args: argparse.Namespace) -> None:
    if args.action == "tokenizer":
        fetch_tokenizer(cfg)
    elif args.action == "dataset":
        from llm_pipeline.training.torchtitan import dataset

        dataset.stage(cfg)
    elif args.action in ("job", "retain"):
        if not args.rung:
            raise StepError(f"{args.action} needs --rung (one of torchtitan.rungs)")
        if args.action == "job":
            write_job(cfg, args.rung)
        else:
            storage.retain(cfg, args.rung, metrics_read=False)
    elif args.action == "report":
        report(cfg)
    elif cfg.torchtitan.export_hf:
        export(cfg)
    else:
        print("torchtitan.export_hf is false: no Hugging Face export", flush=True)


def main(argv=None) -> int:
    return cli.run_step(build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
