"""The benchmark step on the tiny model, in the vLLM site (.venv/vllm-cpu; HPL_VLLM_PYTHON names another): it
serves each model with vLLM, scores a tiny local task in lm-eval's standard format through the server, and its
scores equal lm-eval run directly on the same models and task (lm-eval's own in-process transformers model type).
The task's answers are the base model's own choices (so the base scores 1) and the tuned model is the base with its
output layer negated (so it picks the choice the base likes least: it scores 0): the gate (benchmark.max_drop) fails
the step naming the task, after the report is written. The step runs offline, as benchmark.sbatch runs it, on the
task datasets the download step's `--cache-datasets` prepared, and prepares none anywhere else."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from chart_checks import read_png

from llm_pipeline import benchmark, charts, config, vllm_server
from llm_pipeline.config import BENCHMARK_TASKS, ConfigError, load
from llm_pipeline.run_files import BENCHMARK_JSON, server_log
from tests.vllm_site import site_python
from tools import tiny_model as tiny

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.engine


def base_choices(model_dir: Path, task_dir: Path) -> list[int]:
    """The choice the model gives the highest log-likelihood, per row, as lm-eval asks it: the context's tokens (no
    BOS, as lm-eval's completions model sends them), then one choice word."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    picks = []
    for line in (task_dir / f"{tiny.TINY_TASK}.jsonl").read_text().splitlines():
        row = json.loads(line)
        context = tokenizer(f"### Instruction\n{row['question']}\n\n### Answer\n")["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([context])).logits[0, -1].log_softmax(-1)
        ids = [tokenizer(f" {choice}", add_special_tokens=False)["input_ids"] for choice in row["choices"]]
        assert all(len(one) == 1 for one in ids), ids  # one token each: the score is that token's
        picks.append(max(range(len(ids)), key=lambda i: logits[ids[i][0]].item()))
    return picks


def negated_head(model_dir: Path, out: Path) -> Path:
    """The model with lm_head negated: every choice's order reversed."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(out / "model.safetensors")
    weights["lm_head.weight"] = -weights["lm_head.weight"]
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def direct_lm_eval(models: list[Path], task_dir: Path) -> list[dict]:
    """lm-eval on each model itself (its hf model type: transformers in process, no server), the step's settings, in
    one process. Not its vllm type: that would start vLLM once more per model, and what is compared is lm-eval's
    scoring of the models, which the step's servers already put through vLLM."""
    code = f"""
import json, os, lm_eval
from lm_eval.tasks import TaskManager
os.chdir({str(task_dir)!r})
tasks = TaskManager(include_path={str(task_dir)!r})  # lm-eval's whole index, as lm-eval's own use builds it
for model in {[str(model) for model in models]!r}:
    out = lm_eval.simple_evaluate(model="hf", model_args={{"pretrained": model, "dtype": "float32", "device": "cpu",
        "max_length": 512}}, tasks=[{tiny.TINY_TASK!r}], num_fewshot=0, task_manager=tasks,
        random_seed=1234, numpy_random_seed=1234, torch_random_seed=1234, fewshot_random_seed=1234)
    print("RESULT " + json.dumps(out["results"][{tiny.TINY_TASK!r}]))
"""
    run = subprocess.run([site_python(), "-c", code], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line.removeprefix("RESULT ")) for line in run.stdout.splitlines() if line.startswith("RESULT ")]


def test_step_scores_equal_lm_eval_direct_and_the_gate_names_the_dropped_task(tmp_path):
    # vLLM's CPU attention serves head sizes from 32 (vllm_server.CPU_HEAD_SIZES): the tiny Llama with 2 heads of 32
    base = tiny.write_tiny_model(tmp_path / "tiny-llama", **tiny.SERVABLE_SHAPE)
    tasks = tiny.write_tiny_task(tmp_path / "tasks")
    rows = [json.loads(line) for line in (tasks / f"{tiny.TINY_TASK}.jsonl").read_text().splitlines()]
    picks = base_choices(base, tasks)
    (tasks / f"{tiny.TINY_TASK}.jsonl").write_text(
        "".join(json.dumps({**row, "answer": pick}) + "\n" for row, pick in zip(rows, picks, strict=True))
    )
    run_dir = tmp_path / "run"
    negated_head(base, run_dir / "merged")
    config = tmp_path / "run.toml"
    config.write_text(
        f'[model]\ndtype = "float32"\n[paths]\nmodel_dir = "{base}"\noutput_dir = "{run_dir}"\n'
        f'[benchmark]\ntasks = ["{tiny.TINY_TASK}:0"]\ntask_dir = "tasks"\nmax_model_len = 512\nmax_drop = 0.5\n'
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'payloads'}", "HPL_ACCELERATOR": "none"}
    env |= {"HPL_DATASETS_DIR": str(tmp_path / "datasets"), "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("HF_DATASETS_CACHE", None)
    cache, filled = fill_datasets_cache(config, env)
    # as benchmark.sbatch runs it: offline, so the step must read the cache the download step filled
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    step = subprocess.run(
        [site_python(), "-m", "llm_pipeline.benchmark", "--config", str(config)],
        capture_output=True,
        text=True,
        env=offline,
        timeout=1200,
    )
    assert step.returncode == 2, step.stderr[-3000:]
    # read, not prepared again, and nothing prepared in datasets' own cache (a step that forgot the cache would)
    assert sorted(p.relative_to(cache) for p in cache.rglob("*.arrow")) == filled
    assert not list((tmp_path / "hf-home").rglob("*.arrow"))
    last = step.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: benchmark.max_drop: {tiny.TINY_TASK} dropped 1.0000"), last
    record = json.loads((run_dir / "benchmark" / benchmark.BENCHMARK_JSON).read_text())
    (row,) = record["tasks"]
    assert (row["base"], row["tuned"], row["delta"]) == (1.0, 0.0, -1.0)
    # the base's scores kept (beside the datasets cache) for the project's next run with the same inputs
    assert record["base_scores_from"] is None
    (kept,) = (tmp_path / "datasets" / benchmark.BASE_SCORES).glob("*.json")
    assert json.loads(kept.read_text())["scores"][tiny.TINY_TASK]["score"] == row["base"]
    # lm-eval on each model directly: the same scores and stderrs
    direct = direct_lm_eval([base, run_dir / "merged"], tasks)
    found = [(one["acc,none"], one["acc_stderr,none"]) for one in direct]
    assert found == [(row["base"], row["base_stderr"]), (row["tuned"], row["tuned_stderr"])]
    assert "| tiny_words | acc,none | 0 | 1.0000 |" in (run_dir / "benchmark" / benchmark.REPORT).read_text()
    # each server loaded its model in the engine's process (vllm_server.UNI_EXECUTOR), no worker process beside it
    for model in benchmark.MODELS:
        log = (run_dir / "benchmark" / server_log(model)).read_text().splitlines()
        loaded = [line for line in log if "Starting to load model" in line]
        assert len(loaded) == 1 and loaded[0].startswith("(EngineCore pid="), (model, loaded)


def test_a_task_folder_holding_every_task_is_indexed_alone_and_its_tasks_win_over_lm_evals(tmp_path):
    """benchmark.task_index: the folder's index alone when it holds every task (the rehearsal's tiny task: no 8 CPU-s
    spent indexing lm-eval's own), lm-eval's too when a task is not the folder's. A folder task named like one of
    lm-eval's (arc_easy here) is the folder's either way, so leaving lm-eval's index out changes no task."""
    tasks = tiny.write_tiny_task(tmp_path / "tasks")
    shadow = (tasks / f"{tiny.TINY_TASK}.yaml").read_text().replace(f"task: {tiny.TINY_TASK}", "task: arc_easy")
    (tasks / "arc_easy.yaml").write_text(shadow)
    code = f"""
import json
from llm_pipeline.benchmark import task_index
own = task_index({str(tasks)!r}, ({tiny.TINY_TASK!r}, "arc_easy"))
both = task_index({str(tasks)!r}, ({tiny.TINY_TASK!r}, "hellaswag"))
print(json.dumps({{"own": own.all_subtasks, "both": len(both.all_subtasks), "hellaswag": "hellaswag" in both.all_tasks,
    "arc_easy": [str(index.task_index["arc_easy"].yaml_path) for index in (own, both)],
    "once": task_index({str(tasks)!r}, ({tiny.TINY_TASK!r}, "arc_easy")) is own}}))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "payloads"), "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run([site_python(), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["own"] == sorted([tiny.TINY_TASK, "arc_easy"]) and found["once"]
    assert found["hellaswag"] and found["both"] > 1000  # lm-eval's own, indexed
    assert found["arc_easy"] == [str(tasks / "arc_easy.yaml")] * 2


def test_a_bad_task_name_is_refused_at_load(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[benchmark]\ntasks = ["mmlu:5", "gsm8kk:5"]\n')
    with pytest.raises(ConfigError, match=r"benchmark.tasks: invalid value 'gsm8kk' .*did you mean 'gsm8k'\?"):
        load(config)
    tiny.write_tiny_task(tmp_path / "tasks")
    config.write_text(f'[benchmark]\ntasks = ["{tiny.TINY_TASK}:0", "mmlu:5"]\ntask_dir = "tasks"\n')
    assert load(config).benchmark.task_shots() == {tiny.TINY_TASK: 0, "mmlu": 5}
    config.write_text('[benchmark]\ntasks = ["mmlu"]\n')
    with pytest.raises(ConfigError, match="'name:few-shot count'"):
        load(config)


def test_every_default_task_has_its_primary_metric():
    assert set(BENCHMARK_TASKS) == set(benchmark.PRIMARY_METRICS)


def test_a_head_size_the_cpu_backend_lacks_is_refused_before_the_server_starts(tmp_path, tiny_models_dir):
    with pytest.raises(vllm_server.StepError, match=r"head size 16 .* serves \(32, 64"):
        vllm_server.check_cpu_head_size(tiny_models_dir / "tiny-llama")
    vllm_server.check_cpu_head_size(tiny.write_tiny_model(tmp_path / "m", **tiny.SERVABLE_SHAPE))


def test_only_a_cpu_server_asks_for_the_uni_executor_and_gets_what_keeps_it(tmp_path, monkeypatch):
    cfg = config.from_dict({}, base_dir=tmp_path)
    keep = vllm_server.KEEP_UNI_EXECUTOR
    monkeypatch.delenv(*keep, raising=False)
    for accelerator, on_cpu in (("none", True), ("cuda", False)):
        monkeypatch.setenv("HPL_ACCELERATOR", accelerator)
        command = vllm_server.server_command(tmp_path / "model", 8000, cfg)
        assert ("--distributed-executor-backend" in command) == on_cpu, command
        env = vllm_server.server_env(command)
        assert ({key: env.get(key) for key in keep} == keep) == on_cpu and env["PATH"] == os.environ["PATH"]


def test_gate_passes_within_max_drop_and_names_the_first_task_beyond():
    rows = [{"task": "a", "metric": "acc,none", "base": 0.5, "tuned": 0.45, "delta": -0.05}]
    benchmark.gate(rows, 0.05)
    rows.append({"task": "b", "metric": "acc,none", "base": 0.5, "tuned": 0.3, "delta": -0.2})
    with pytest.raises(benchmark.StepError, match=r"^benchmark.max_drop: b dropped 0.2000"):
        benchmark.gate(rows, 0.1)


def fill_datasets_cache(config: Path, env: dict[str, str]) -> tuple[Path, list[Path]]:
    """`benchmark --cache-datasets` (download.sbatch's, in the vLLM site): every dataset lm-eval loads for
    benchmark.tasks prepared into <HPL_DATASETS_DIR>/benchmark-datasets; the folder and its prepared files. The Hub
    is out of reach here: the tiny task's data is a JSON-lines file, which `datasets` prepares through the same
    download-and-prepare path and cache as a Hub dataset."""
    fill = subprocess.run(
        [site_python(), "-m", "llm_pipeline.benchmark", "--config", str(config), "--cache-datasets"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert fill.returncode == 0, fill.stderr[-3000:]
    cache = Path(env["HPL_DATASETS_DIR"]) / benchmark.DATASETS_CACHE
    assert f"cached in {cache}" in fill.stdout
    filled = sorted(p.relative_to(cache) for p in cache.rglob("*.arrow"))
    assert filled, f"no prepared dataset in {cache}"
    return cache, filled


def scored_config(folder: Path, run: str, model: Path, **keys) -> config.RunConfig:
    """A run of the project in ``folder``/outputs benchmarking ``model`` on the tiny task (written once)."""
    if not (folder / "tasks").is_dir():
        tiny.write_tiny_task(folder / "tasks")
    bench = {"tasks": [f"{tiny.TINY_TASK}:0"], "task_dir": "tasks", **keys}
    raw = {"paths": {"model_dir": str(model), "output_dir": str(folder / "outputs" / run)}, "benchmark": bench}
    return config.from_dict(raw, base_dir=folder)


def test_the_base_scores_key_follows_the_base_model_the_tasks_and_the_score_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("HPL_DATASETS_DIR", str(tmp_path / "datasets"))
    model = tiny.write_tiny_model(tmp_path / "base", **tiny.SERVABLE_SHAPE)
    key = benchmark.base_scores_key(scored_config(tmp_path, "one", model))
    # another run of the project with the same inputs: the same key and file, beside the runs
    other = scored_config(tmp_path, "two", model, concurrency=8)  # concurrency changes only the speed
    assert benchmark.base_scores_key(other) == key
    kept = benchmark.base_scores_file(other, key)
    assert kept.parent == tmp_path / "datasets" / benchmark.BASE_SCORES
    assert kept == benchmark.base_scores_file(scored_config(tmp_path, "one", model), key)
    changed = {
        "seed": benchmark.base_scores_key(scored_config(tmp_path, "three", model, seed=7)),
        "limit": benchmark.base_scores_key(scored_config(tmp_path, "four", model, limit=5)),
        "tasks": benchmark.base_scores_key(scored_config(tmp_path, "five", model, tasks=[f"{tiny.TINY_TASK}:1"])),
    }
    monkeypatch.setenv("HPL_ACCELERATOR", "cuda")
    changed["accelerator"] = benchmark.base_scores_key(scored_config(tmp_path, "six", model))
    monkeypatch.delenv("HPL_ACCELERATOR")
    data = tmp_path / "tasks" / f"{tiny.TINY_TASK}.jsonl"
    data.write_text(data.read_text().replace("\n", "\n\n", 1))
    changed["task files"] = benchmark.base_scores_key(scored_config(tmp_path, "seven", model))
    tiny.write_tiny_model(model, seed=1, **tiny.SERVABLE_SHAPE)  # refilled weights, same names and sizes
    changed["weights"] = benchmark.base_scores_key(scored_config(tmp_path, "eight", model))
    assert {what: found == key for what, found in changed.items()} == dict.fromkeys(changed, False)


def test_kept_base_scores_are_read_instead_of_serving_the_base(tmp_path, capsys, monkeypatch):
    """No vLLM in this venv: serving the base would fail, so the kept scores are what the step takes."""
    monkeypatch.setenv("HPL_DATASETS_DIR", str(tmp_path / "datasets"))
    model = tiny.write_tiny_model(tmp_path / "base", **tiny.SERVABLE_SHAPE)
    cfg = scored_config(tmp_path, "two", model)
    key = benchmark.base_scores_key(cfg)
    scores = {tiny.TINY_TASK: {"metric": "acc,none", "score": 0.5, "stderr": 0.1, "shots": 0}}
    kept = benchmark.base_scores_file(cfg, key)
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"key": key, "run": "one", "scores": scores}))
    assert benchmark.base_scores(cfg, tmp_path / "benchmark") == (scores, str(kept))
    assert f"base model scores from {kept} (run one" in capsys.readouterr().out
    kept.write_text(json.dumps({"key": {**key, "tasks": {}}, "run": "one", "scores": scores}))  # another key
    with pytest.raises(benchmark.StepError, match=r"the vLLM server for .* exited"):
        benchmark.base_scores(cfg, tmp_path / "benchmark")


def test_the_datasets_cache_needs_its_folder(monkeypatch):
    monkeypatch.delenv("HPL_DATASETS_DIR", raising=False)
    caches = rf"the benchmark's caches \({benchmark.DATASETS_CACHE}, {benchmark.BASE_SCORES}\)"
    with pytest.raises(benchmark.StepError, match=rf"^HPL_DATASETS_DIR is not set: {caches}"):
        benchmark.use_datasets_cache()


def test_the_chart_draws_base_and_tuned_per_task_with_their_stderr(tmp_path):
    """`python -m llm_pipeline.charts benchmark <run>/benchmark` (benchmark.sbatch, after the step): a bar per model
    and task at its score, an error bar of its stderr (of length 0 where lm-eval reported none)."""
    rows = [
        {"task": "gsm8k", "shots": 5, "base": 0.5, "base_stderr": 0.02, "tuned": 0.6, "tuned_stderr": 0.03},
        {"task": "ifeval", "shots": 0, "base": 0.7, "base_stderr": None, "tuned": 0.4, "tuned_stderr": None},
    ]
    (tmp_path / BENCHMARK_JSON).write_text(json.dumps({"tasks": rows, "serving": {}}))
    assert charts.main(["benchmark", str(tmp_path)]) == 0
    read_png(tmp_path / benchmark.CHART)
    axis = charts.tasks_figure(rows).axes[0]
    bars = {label: [bar.get_height() for bar in container] for container, label in zip(
        axis.containers[:2], ("base", "tuned"), strict=True)}  # fmt: skip
    assert bars == {"base": [0.5, 0.7], "tuned": [0.6, 0.4]}
    errors = [list(collection.get_segments()) for collection in axis.collections]
    assert [[round(seg[1][1] - seg[0][1], 6) for seg in found] for found in errors] == [[0.04, 0.0], [0.06, 0.0]]
    assert [tick.get_text() for tick in axis.get_xticklabels()] == ["gsm8k (5-shot)", "ifeval (0-shot)"]
