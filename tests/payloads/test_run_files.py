"""Every line and file a run leaves for another program has one format (llm_pipeline/run_files.py): what
its writer prints reads back to the same text, a diverged loss (nan, inf) included, and no other module
carries its own pattern for those lines."""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from llm_pipeline.run_files import (
    CHECKPOINT,
    REWARD_FUNCTION_SERIES,
    RUN_SERIES,
    TITAN_STEP,
    BackendLine,
    DataSource,
    Estimate,
    EventLine,
    MetricSample,
    MetricsTextfile,
    PipelineRecord,
    ProgressLine,
    ReplicasLine,
    StepEstimate,
    StepJob,
    StepLog,
    StepMarker,
    StepVerdict,
    SubmittedLine,
    TitanMetricLine,
    TrainableLine,
    describe_number,
)

ROOT = Path(__file__).parents[2]
LOSSES = [1.2345, 0.0, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("loss", LOSSES)
def test_the_progress_line_reads_back_what_it_wrote(loss):
    line = ProgressLine(12, 40, loss, 2e-5, 3.7, 15155.0, "0:01:00", ("mfu 41.2%", "peak mem 12.00 GB")).format()
    parsed = ProgressLine.parse(f"  {line}  ")
    assert parsed.format() == line
    assert (parsed.step, parsed.total, parsed.extra, parsed.eta) == (
        12,
        40,
        ("mfu 41.2%", "peak mem 12.00 GB"),
        "0:01:00",
    )
    assert parsed.loss == loss or (math.isnan(loss) and math.isnan(parsed.loss))


def test_a_figure_is_read_by_its_whole_label():
    # "reward std" starts with "reward ": whichever comes first, each label reads its own number
    for extra in (("reward std 0.4000", "reward 0.2500"), ("reward 0.2500", "reward std 0.4000")):
        line = ProgressLine.parse(ProgressLine(1, 2, 0.5, 1e-5, 1.0, 10.0, "0:00:01", extra).format())
        assert (line.figure("reward"), line.figure("reward std"), line.figure("kl")) == (0.25, 0.4, None)


def test_a_line_without_the_throughput_fields_is_no_progress_line():
    assert ProgressLine.parse("step 3/4 | eval_loss 1.2 | epoch 1") is None
    assert ProgressLine.parse("step 3/4 | loss x | lr 1e-5 | 1.00 samples/s | 10 tokens/s | eta 0:00:01") is None


@pytest.mark.parametrize("loss", LOSSES)
def test_torchtitan_metric_line_reads_back_with_and_without_the_logger_prefix(loss):
    line = TitanMetricLine(10, loss, 1.2345, 61.05, 77.17, 6475, 374.71, 37.89)
    assert TitanMetricLine.parse(line.format()).format() == line.format()
    stamped = TitanMetricLine(
        10, loss, 1.2345, 61.05, 77.17, 6475, 374.71, 37.89, datetime(2026, 1, 1, 10, 0, 1, 250000)
    )
    text = stamped.format()
    assert text.startswith("[titan] 2026-01-01 10:00:01,250 - root - INFO - step: 10  loss: ")
    again = TitanMetricLine.parse(f"\x1b[31m{text}\x1b[39m")  # colors on: stripped first
    assert again.format() == text and again.time == stamped.time
    assert TitanMetricLine.parse("validate step: 10  loss: 1.0  grad_norm: 1.0  memory: 1.00GiB(1.00%)  tps: 1  "
                                 "tflops: 1.00  mfu: 1.00%") is None  # fmt: skip


@pytest.mark.parametrize(
    "verdict",
    [
        StepVerdict("train", "COMPLETED", 0, 12),
        StepVerdict("smoke-train-resume", "FAILED", 3, 0, "2026-01-01T10:00:00Z"),
    ],
)
def test_the_step_verdict_reads_back(verdict):
    assert StepVerdict.parse(verdict.format()) == verdict
    log = f"== {verdict.step}: job 7 on node1\nwork\n{verdict.format()}\n"
    assert StepVerdict.last(log, verdict.step) == verdict and StepVerdict.last(log, "other") is None


def test_the_shell_writer_in_env_sh_writes_the_verdict_format(tmp_path):
    """payloads/slurm/env.sh's EXIT trap is the Slurm lane's writer: a step that exits 3 ends its log with
    the verdict this module parses and formats back to the same line."""
    env = {
        **os.environ,
        "HPL_PAYLOADS_DIR": str(ROOT / "payloads"),
        "HPL_RUN_CONFIG": str(tmp_path / "run.toml"),
        "HPL_RUN_DIR": str(tmp_path / "run"),
        "HPL_FSX_MOUNT_PATH": str(tmp_path),
        "HPL_RUNTIME": "host",
    }
    script = f"source {ROOT / 'payloads' / 'slurm' / 'env.sh'} train; exit 3"
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    verdict = StepVerdict.parse(last)
    assert (verdict.step, verdict.state, verdict.exit_code) == ("train", "FAILED", 3) and verdict.at
    assert verdict.format() == last
    # hpl_mark, the same trap's other writer: the step marker reads back, and writes back the same fields.
    marker = StepMarker.from_json((tmp_path / "run" / "logs" / "state" / "train.json").read_text())
    assert (marker.step, marker.state, marker.exit_code, marker.final) == ("train", "FAILED", 3, True)
    assert marker.node and marker.time.endswith("Z")
    assert StepMarker.from_json(marker.to_json()) == marker


@pytest.mark.parametrize("exit_code", [None, 0, 143])
def test_the_step_marker_reads_back(exit_code):
    marker = StepMarker("smoke-train", "12", "RUNNING" if exit_code is None else "CANCELLED", exit_code, "n1", "t")
    assert StepMarker.from_json(marker.to_json()) == marker
    assert marker.final is (exit_code is not None)


@pytest.mark.parametrize("value", [2.5, 0.0, 1e-05, math.nan, math.inf, -math.inf])
def test_the_metrics_textfile_reads_back(value):
    labels = (("run", 'a "quoted"\\ run\nname'), ("slurm_job_id", "12"))
    textfile = MetricsTextfile(
        (MetricSample("hpl_train_loss", labels, value, "training loss"), MetricSample("hpl_train_step", labels, 3.0))
    )
    text = textfile.format()
    again = MetricsTextfile.parse(text)
    assert again.format() == text
    loss = again.samples[0]
    assert (loss.name, loss.labels, loss.help) == ("hpl_train_loss", labels, "training loss")
    assert (math.isnan(loss.value) and math.isnan(value)) or loss.value == value
    assert again.values()["hpl_train_step"] == 3.0
    spelled = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(str(value), repr(value))
    assert text.splitlines()[2] == f'hpl_train_loss{{run="a \\"quoted\\"\\\\ run\\nname",slurm_job_id="12"}} {spelled}'


def test_a_line_that_is_no_sample_is_refused():
    with pytest.raises(ValueError, match="not a Prometheus sample line"):
        MetricsTextfile.parse("# HELP x y\nx{run=} 1 2 3\n")


@pytest.mark.parametrize("value", LOSSES)
def test_the_event_line_reads_back(value):
    line = EventLine(30, 30, (("eval_loss", value), ("epoch", 3.0)))
    again = EventLine.parse(line.format())
    assert again.format() == line.format() and again.figures[1] == ("epoch", 3.0)
    shown = float(f"{value:.4g}")  # four significant digits, as printed
    assert (math.isnan(again.figures[0][1]) and math.isnan(value)) or again.figures[0][1] == shown
    progress = ProgressLine(3, 4, value, 2e-5, 3.7, 15155.0, "0:00:01").format()
    assert EventLine.parse(progress) is None and ProgressLine.parse(line.format()) is None


def test_the_trainer_start_lines_read_back():
    replicas = ReplicasLine(0, 40, 8)
    assert ReplicasLine.parse(replicas.format()) == replicas
    backend = BackendLine("training", "torch", "resuming from /run/checkpoints/checkpoint-2")
    assert BackendLine.parse(backend.format()) == backend


def test_the_pipeline_record_reads_back():
    record = PipelineRecord(
        "run.toml", (StepJob("data", "11", "/run/logs/data-11.log"), StepJob("train", "12", "t", 2, "p.toml"))
    )
    assert PipelineRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize("seconds_per_step", [0.5, math.nan, math.inf])
def test_the_estimate_reads_back(seconds_per_step):
    estimate = Estimate(
        "run.toml",
        "trn1",
        (StepEstimate("train", 2, 1800.0, "measured"), StepEstimate("merge", 1, 60.0, "its smoke run's duration")),
        {"train": seconds_per_step},
        "billed per node",
    )
    again = Estimate.from_json(estimate.to_json())
    assert again.to_json() == estimate.to_json()
    assert (again.total_seconds, again.node_hours) == (1860.0, pytest.approx(1 + 60 / 3600))


def test_the_data_source_reads_back_and_names_each_change():
    record = DataSource({"max_length": 128, "packing": False, "dataset": "rows.jsonl"}, 42, "ab12", "cd34")
    assert DataSource.from_json(record.to_json()) == record
    assert record.changes(DataSource.from_json(record.to_json())) == []
    now = DataSource({"max_length": 64, "packing": False, "dataset": "rows.jsonl"}, 7, "ab12", "")
    assert record.changes(now) == [
        "data.max_length (prepared with 128, now 64)",
        "train.seed (prepared with 42, now 7)",
        "data.dataset file(s) (written again since)",
    ]
    older = DataSource.from_json('{"data": {"max_length": 128}, "seed": 42}')  # before the digests were recorded
    assert older.tokenizer == "" and "tokenizer (the tokenizer files in paths.model_dir differ)" in older.changes(now)


def test_a_diverged_loss_is_spelled_for_people():
    assert [describe_number(v) for v in LOSSES] == ["1.2345", "0.0000", "NaN", "Inf", "-Inf"]


# The markers of the lines this module owns: a regular expression holding one belongs here.
RUN_LINE_MARKERS = (
    *("loss", "samples/s", "tokens/s", "tps:", "== ", "data-parallel", "backend", "[titan]"),
    *("hpl_train_", "slurm_job_id", "submitted ", "trainable parameters"),
)
REGEX_CALLS = {"compile", "match", "fullmatch", "search", "findall", "finditer", "sub", "subn", "split"}


def _regex_texts(path: Path) -> list[str]:
    texts = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in REGEX_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
        ):
            pattern = node.args[0]
            parts = pattern.values if isinstance(pattern, ast.JoinedStr) else [pattern]
            texts.append("".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)))
    return texts


def test_no_pattern_for_a_run_line_outside_the_run_files_module():
    owner = ROOT / "payloads" / "llm_pipeline" / "run_files.py"
    folders = ("payloads", "hpctl", "tools", "tests", "bench", "stacks", "lifecycle")
    found = [
        f"{path.relative_to(ROOT)}: {text!r}"
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != owner
        for text in _regex_texts(path)
        if any(marker in text for marker in RUN_LINE_MARKERS)
    ]
    assert found == []


def test_the_pattern_finder_sees_a_run_line_pattern(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        'import re\nX = re.compile(r"^step (\\\\d+)/\\\\d+ \\\\| loss")\ny = re.search(rf"== {1}: COMPLETED", "")\n'
    )
    assert [any(m in text for m in RUN_LINE_MARKERS) for text in _regex_texts(module)] == [True, True]


# How a run-folder name is typed in code when a module spells it itself: checkpoint-<step>, torchtitan's
# step-<step>, a job's <step>-<job>.log and the data step's report; run_files is their one owner.
TYPED_RUN_FOLDER_NAMES = re.compile(
    r"checkpoint-\{|\"checkpoint-\*\"|checkpoint-\(\\d|\"step-\*\"|step-\(\\d|-%j\.log|\}\.log\"|\\d\+\)\\\.log"
    r"|\"stats\.json\""
)


def test_run_folder_names_are_typed_in_run_files_only():
    root = Path(__file__).parents[2]
    owner = root / "payloads" / "llm_pipeline" / "run_files.py"
    sources = [path for folder in ("payloads", "hpctl") for path in (root / folder).rglob("*.py") if path != owner]
    typed = [
        f"{path.relative_to(root)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TYPED_RUN_FOLDER_NAMES.search(line)
    ]
    assert len(sources) > 100 and typed == []
    old_forms = (  # what the modules typed before run_files owned the names: each is caught
        'f"--output={facts.logs_dir / job.step}-%j.log",',
        'log = str(facts.logs_dir / f"{job.step}-{job_id}.log")',
        'TRAIN_LOG = re.compile(r"^train-(?P<job>\\d+)\\.log$")',
        'steps = sorted(int(m[1]) for p in c.glob("checkpoint-*") if (m := re.match(r"checkpoint-(\\d+)$", p.name)))',
        'write_seal(Path(args.output_dir) / f"checkpoint-{state.global_step}", node=node, nodes=nodes)',
        'match = re.fullmatch(r"step-(\\d+)", path.name)',
        'for path in folder.glob("step-*") if folder.is_dir() else []:',
        'STATS_FILE = "stats.json"',
    )
    assert all(TYPED_RUN_FOLDER_NAMES.search(line) for line in old_forms)


def test_step_logs_and_step_folders_name_and_parse_one_way(tmp_path):
    assert StepLog("smoke-train-resume", "42").name == "smoke-train-resume-42.log"
    assert StepLog.parse("smoke-train-resume-42.log") == StepLog("smoke-train-resume", "42")
    assert StepLog.parse("train.log") is None and StepLog.parse("train-4a.log") is None
    for name in ("train-12.log", "train-3.log", "smoke-train-5.log", "rung-fp8-7.log", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [log.name for log, _ in StepLog.of(tmp_path, lambda step: step.endswith("train"))] == [
        "train-3.log",
        "smoke-train-5.log",
        "train-12.log",
    ]
    for name in ("checkpoint-10", "checkpoint-9", "checkpoint-x", "step-3"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-11").write_text("a file, not a checkpoint")
    assert CHECKPOINT.folders(tmp_path) == [(9, tmp_path / "checkpoint-9"), (10, tmp_path / "checkpoint-10")]
    assert TITAN_STEP.folders(tmp_path) == [(3, tmp_path / "step-3")] and CHECKPOINT.name(4) == "checkpoint-4"


def test_the_run_series_are_named_in_run_files_only():
    """One table of the run's series (run_files.RUN_SERIES): the textfile writer, hpctl and the tools read it,
    and the dashboard charts only series it holds, each of them."""
    owner = ROOT / "payloads" / "llm_pipeline" / "run_files.py"
    prefix = "hpl_train_"
    sources = [path for folder in ("payloads", "hpctl", "tools") for path in (ROOT / folder).rglob("*.py")]
    typed = [str(path.relative_to(ROOT)) for path in sources if path != owner and prefix in path.read_text()]
    assert len(sources) > 100 and typed == []
    dashboard = (ROOT / "observability" / "dashboards" / "cluster-and-run.json").read_text()
    charted = {word for word in re.split(r"[^\w]", dashboard) if word.startswith(prefix)}
    names = {series.name for series in (*RUN_SERIES, REWARD_FUNCTION_SERIES)}
    assert charted <= names, f"the dashboard charts series run_files does not name: {sorted(charted - names)}"
    assert names - charted == {"hpl_train_max_steps", "hpl_train_last_update_timestamp_seconds"}


def test_the_submitted_and_trainable_lines_read_back():
    line = SubmittedLine("train (2 node(s))", "43")
    assert SubmittedLine.parse(line.format()) == line and line.step == "train"
    text = "noise\nsubmitted prepare job 1\nsubmitted smoke-train job 2\nsubmitted train (2 node(s)) job 43\n"
    assert SubmittedLine.jobs(text) == {"prepare": "1", "smoke-train": "2", "train (2 node(s))": "43"}
    trainable = TrainableLine("qlora", "1,234,567", "; 8 process(es)")
    assert TrainableLine.parse(trainable.format()) == trainable and trainable.trainable == 1234567
    assert TrainableLine.find(f"[rank0]: {trainable.format()}\nmore") == trainable
