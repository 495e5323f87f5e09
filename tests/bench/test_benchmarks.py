"""The benchmark scripts are code under test: each runs once, whole, at the tiny shape, with a temporary
report and work folder (never the committed docs/ reports), and the test fails when any variant this
machine can run failed or left no figures. A variant this machine cannot run (a CUDA-only lever) must
be reported as not run, with the script's reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import merge_bench, options, serve_bench, train_bench
from bench.synthetic_llama import SHAPES, SMOKE_SHAPE, tensor_shapes
from llm_pipeline import vllm_server
from tests.vllm_site import site_python

REPO = Path(__file__).resolve().parents[2]
LIMIT_S = 1200  # a hung benchmark fails the test instead of the suite


def run_bench(script: str, tmp_path: Path, *args: str, python: Path | str = sys.executable) -> str:
    """Run bench/<script> with a temporary report and work folder; the report's text."""
    report, work = tmp_path / "report.md", tmp_path / "work"
    committed = {path: path.read_bytes() for path in (REPO / "docs").glob("*benchmark*.md")}
    done = subprocess.run(
        [python, str(REPO / "bench" / script), *args, "--workdir", str(work), "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    assert {path: path.read_bytes() for path in committed} == committed, "a smoke run rewrote a docs/ report"
    assert not work.exists(), f"{script} left its generated files in {work}"
    return report.read_text()


def json_block(report: str) -> dict:
    return json.loads(report.split("```json", 1)[1].split("```", 1)[0])


def table_row(report: str, first_cell: str) -> list[str]:
    rows = [line for line in report.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"expected one table row for {first_cell!r}, found {rows}"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


@pytest.mark.rehearsal
def test_train_bench_runs_every_variant_on_both_layouts(tmp_path):
    report = run_bench(
        "train_bench.py", tmp_path, "--shape", SMOKE_SHAPE, "--seq-len", "64", "--batch", "1", "--steps", "1",
        "--warmup", "1",
    )  # fmt: skip
    record = json_block(report)
    expected = [name for name, _, _ in train_bench.variants()]
    assert expected == [f"{kind}/{layout}" for layout in ("padded", "packed") for kind in train_bench.KINDS]
    assert list(record["variants"]) == expected
    for name in expected:
        result = record["variants"][name]
        assert "error" not in result, f"{name} failed: {result['error']}"
        assert result["tokens_per_second"] > 0 and result["peak_memory_gb"] > 0 and result["warmup_s"] > 0, name
        assert result["samples"] and all(sample > 0 for sample in result["samples"]), name
        cells = table_row(report, name)
        assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[5]) > 0, cells
    flags = {name: result["flags"] for name, result in record["variants"].items()}
    for layout in ("padded", "packed"):
        # (c) runs what the engine resolved, read back from each trainer; (b) is trl's own choice
        assert flags[f"trl-engine-flags/{layout}"] == flags[f"engine-defaults/{layout}"]
        assert "loss on answers" in flags[f"engine-defaults/{layout}"]
        assert "checkpointing off" in flags[f"engine-defaults/{layout}"]  # LoRA default
        plain = flags[f"trl-defaults/{layout}"]
        assert "checkpointing on, " in plain and "loss on every token" in plain
    # the chart beside the report, opened: one bar per variant, at its median tokens/s
    from matplotlib.image import imread

    from llm_pipeline import charts

    chart = imread(tmp_path / "report.png")
    assert chart.shape[1] == charts.WIDTH_INCHES * charts.DPI and (chart[..., :3].min(axis=-1) < 0.9).mean() > 0.01
    drawn = [(n, r["tokens_per_second"], r["samples"]) for n, r in record["variants"].items()]
    bars = charts.benchmark_figure(drawn, title="").axes[0].patches
    assert [bar.get_height() for bar in bars] == [record["variants"][n]["tokens_per_second"] for n in expected]
    import torch

    if not torch.cuda.is_available():
        assert report.count("not measured on GPU") >= 2  # once per layout, once for the target itself


@pytest.mark.rehearsal
def test_merge_bench_runs_ours_the_reference_and_the_copy(tmp_path):
    report = run_bench("merge_bench.py", tmp_path, "--shapes", SMOKE_SHAPE, "--repeats", "1", "--quiet-disk-wait", "0")
    runs = json_block(report)[SMOKE_SHAPE]
    for method in ("ours", "copy"):
        assert runs[method]["wall_s"] > 0 and runs[method]["peak_rss_gib"] > 0, method
        assert float(table_row(report, SMOKE_SHAPE + " | " + method)[2]) > 0
    fits, reason = merge_bench.reference_fits(runs["model_bytes"])
    if fits:  # the reference loads the whole model: it runs wherever it fits in memory
        assert runs["reference"]["wall_s"] > 0 and runs["reference"]["peak_rss_gib"] > 0
        assert runs["outputs_agree"] is True
    else:
        assert runs["reference_skipped"] == f"skipped: {reason}"


@pytest.mark.rehearsal
def test_consolidate_bench_runs_ours_and_the_copy(tmp_path):
    report = run_bench(
        "consolidate_bench.py", tmp_path, "--shapes", SMOKE_SHAPE, "--repeats", "1", "--quiet-disk-wait", "0"
    )
    key = f"{SMOKE_SHAPE} TP8 xser"  # the script's defaults: TP 8, the xser rank files optimum-neuron 0.4.5 saves
    runs = json_block(report)[key]
    assert runs["tensors_written"] == len(tensor_shapes(SHAPES[SMOKE_SHAPE]))
    for method in ("ours", "copy"):
        assert runs[method]["wall_s"] > 0 and runs[method]["peak_rss_gib"] > 0, method
        assert float(table_row(report, key + " | " + method)[2]) > 0


@pytest.mark.rehearsal
def test_serve_bench_measures_the_project_settings_against_vllm_defaults(tmp_path):
    """Each configuration served once and measured with the benchmark step's figures, in the vLLM site."""
    report = run_bench("serve_bench.py", tmp_path, "--repeats", "1", python=site_python())
    ((device, entry),) = json_block(report).items()
    for name in serve_bench.CONFIGURATIONS:
        assert all(entry[name][key] > 0 for key in serve_bench.FIGURES), (name, entry[name])
        assert entry[name]["ttft_p50_s"] <= entry[name]["ttft_p95_s"], name
        cells = table_row(report, name)
        assert [float(cell) for cell in cells[1:]] == [float(f"{entry[name][key]:.4g}") for key in serve_bench.FIGURES]
    for key, ratio in entry["ratios"].items():
        assert ratio == pytest.approx(entry["project"][key] / entry[serve_bench.REFERENCE][key]), key
    column = 1 + list(serve_bench.FIGURES).index("output_tokens_per_s")
    assert table_row(report, "project / defaults")[column] == f"{entry['ratios']['output_tokens_per_s']:.2f}x"

    # the project's command is the benchmark step's; the reference's has none of its settings but, on CPU, the memory
    def flags(command: list[str]) -> list[str]:
        return [arg for arg in command if arg.startswith("--")]

    project, defaults = entry["project"]["command"], entry[serve_bench.REFERENCE]["command"]
    where = ["--model", "--served-model-name", "--host", "--port"]
    on_cpu = [] if entry["gpu"] else list(vllm_server.CPU_SERVER_ARGS)
    assert flags(project) == [*where, "--max-model-len", "--seed", "--dtype", *flags(on_cpu)]
    assert flags(defaults) == [*where, *flags(vllm_server.CPU_MEMORY_ARGS if on_cpu else [])]
    if on_cpu:
        assert defaults[-2:] == list(vllm_server.CPU_MEMORY_ARGS) and device.startswith("cpu")
        assert f"GPU: {serve_bench.NOT_ON_GPU}." in report
        # the project's server keeps the model in its engine's process (the uni executor); vLLM's defaults spawn a
        # worker for it (the mp executor its CPU platform swaps in)
        processes = {name: entry[name]["engine_processes"] for name in serve_bench.CONFIGURATIONS}
        assert processes == {"project": 1, serve_bench.REFERENCE: 2}, processes


def test_an_unknown_shape_is_refused_with_the_known_ones(capsys):
    parser = argparse.ArgumentParser(prog="bench")
    assert options.chosen_shapes(parser, " tiny, 8b ") == ["tiny", "8b"]
    for given in ("tiny,2b", " , "):
        with pytest.raises(SystemExit) as stopped:
            options.chosen_shapes(parser, given)
        assert stopped.value.code == 2
        assert f"known: {', '.join(SHAPES)}" in capsys.readouterr().err
