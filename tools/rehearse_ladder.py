"""Rehearse the torchtitan pretraining ladder offline: a local Slurm, the real chain, a CPU stand-in.

    make rehearse-ladder     (= python -m tools.rehearse_ladder [--root .rehearsal-ladder])

1. starts munged/slurmctld/slurmd under <root>/slurm (tools/local_slurm.py);
2. writes a tiny tokenizer where the run config expects the Llama 3 one, so the real tokenizer
   step finds it and skips the Hub, and a tiny c4-format dataset (card and shards) as the source
   the real dataset step stages;
3. submits the ladder a cluster runs (python -m llm_pipeline.submit ladder --wait) with
   tiny-ladder-cpu.toml: four rungs on torchrun with two processes each; torchtitan's trainer
   needs CUDA, so each rung runs tools/torchtitan_standin.py (HPL_TORCHTITAN_MODULE), which trains
   torchtitan's debug model with torchtitan's own parts on CPU, saves its checkpoints and prints
   torchtitan's metric lines; the report step parses them and the export converts the last rung;
4. shows the report; stops the daemons by PID. Exit status 0 only when every job completed.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from llm_pipeline.jobs.chain import INTERRUPTED_EXIT
from tools.local_slurm import LocalSlurm, LocalSlurmError, hand_to_invoking_user
from tools.rehearsal_lock import RehearsalBusy, RehearsalLock
from tools.rehearse import fsx_environment

REPO = Path(__file__).resolve().parents[1]
LADDER_CONFIG = REPO / "payloads" / "configs" / "tiny-ladder-cpu.toml"
STANDIN = "tools.torchtitan_standin"
# torchtitan 0.2.2 and torchao, installed apart from the main environment by `make venv`
# (requirements-torchtitan-cpu.txt: its tyro needs typeguard 4, jsii pins 2).
TORCHTITAN_SITE = Path(sys.prefix) / "torchtitan-site"
RANKS_PER_NODE = 2  # two processes per rung, as GPUs per node: the report aggregates over ranks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ladder_environment(env: dict[str, str]) -> dict[str, str]:
    """The rehearsal's settings on top of the local FSx/Slurm environment."""
    env = dict(env)
    env.update(HPL_DEVICES_PER_NODE=str(RANKS_PER_NODE), HPL_TORCHTITAN_MODULE=STANDIN)
    # launch.py derives the rendezvous port from the job id; local clusters side by side on one
    # machine number their jobs alike, so the rehearsal takes a port that is free now instead.
    env.setdefault("HPL_MASTER_PORT", str(free_port()))
    if not (TORCHTITAN_SITE / "torchtitan" / "__init__.py").is_file():
        raise LocalSlurmError(f"torchtitan is not installed in {TORCHTITAN_SITE}: run `make venv`")
    # tools.* and torchtitan for every job: the stand-in trains with torchtitan's parts, the job step
    # checks each job file with torchtitan's ConfigManager, prepare sizes the flavor, export converts.
    paths = [str(REPO), str(TORCHTITAN_SITE), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def write_tokenizer(config_path: Path, env: dict[str, str]) -> Path:
    """The tiny tokenizer's files (tokenizer.json, tokenizer_config.json) where the tokenizer step looks."""
    from llm_pipeline import config
    from tools import tiny_model as tiny

    folder = Path(config.load(config_path, env=env).paths.model_dir)
    tiny.build_tokenizer().save_pretrained(folder)
    return folder


def write_dataset_source(config_path: Path, env: dict[str, str]) -> Path:
    """A tiny c4-format dataset (card and shards) where torchtitan.dataset_source points: the chain's
    dataset step stages it as it stages allenai/c4 from the Hub."""
    from llm_pipeline import config
    from tools import tiny_model as tiny

    return tiny.write_c4_folder(Path(config.load(config_path, env=env).torchtitan.dataset_source))


def rehearse(root: Path, config_path: Path) -> int:
    """The ladder rehearsal in ``root`` (emptied first); the caller holds its RehearsalLock."""
    from llm_pipeline.jobs.run_facts import read_run_facts

    start = time.monotonic()
    print(f"[1/4] starting a local Slurm under {root / 'slurm'}", flush=True)
    with LocalSlurm(root / "slurm") as slurm:
        env = ladder_environment(slurm.env(fsx_environment(root / "fsx")))
        print(f"[2/4] writing a tiny tokenizer into {write_tokenizer(config_path, env)}", flush=True)
        print(f"      and a tiny c4-format dataset into {write_dataset_source(config_path, env)}", flush=True)
        print(f"[3/4] submitting the ladder with {config_path.name} and following it", flush=True)
        command = [sys.executable, "-m", "llm_pipeline.submit", "ladder", "--config", str(config_path)]
        status = subprocess.run([*command, "--wait", "--poll", "2"], env=env, cwd=REPO / "payloads").returncode
        output_dir = read_run_facts(config_path, env).output_dir
        print("[4/4] the report (a CPU stand-in trained every rung: its figures say nothing about GPUs)", flush=True)
        report = output_dir / "ladder" / "report.md"
        print(report.read_text() if report.is_file() else f"{report}: (missing)")
        if status != 0:
            print(f"\nrehearsal FAILED: job logs are in {output_dir / 'logs'}", file=sys.stderr)
    print(
        f"ladder rehearsal {'passed' if status == 0 else 'failed'} in {time.monotonic() - start:.0f} s; daemons stopped"
    )
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rehearse_ladder", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, default=REPO / ".rehearsal-ladder", help="work folder, wiped first (default: %(default)s)"
    )
    parser.add_argument("--config", type=Path, default=LADDER_CONFIG, help="run config (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        print(f"error: run config {args.config} does not exist", file=sys.stderr)
        return 2
    root = args.root.resolve()
    lock = RehearsalLock(root, what="ladder rehearsal")
    try:
        with lock:
            lock.wipe()
            return rehearse(root, args.config.resolve())
    except (LocalSlurmError, RehearsalBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the local Slurm and its jobs are stopped; the run's files are in {root}", file=sys.stderr)
        return INTERRUPTED_EXIT
    finally:
        hand_to_invoking_user(args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
