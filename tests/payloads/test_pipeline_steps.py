"""The pipeline's steps are one list of records (submit.PIPELINE): submit, sagemaker_job and hpctl read it,
and no module keeps a list of step names of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from llm_pipeline import config, sagemaker_job, submit
from llm_pipeline.jobs.chain import SubmitError, check_vllm_on_the_nodes, staged_chain
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.jobs.sagemaker_env import JobHosts

ROOT = Path(__file__).parents[2]
STEP_NAMES = {job.step for job in submit.PIPELINE}


def _step_lists(tree: ast.AST) -> list[list[str]]:
    """Tuple, list or set literals naming three or more of the pipeline's steps."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in STEP_NAMES]
            if len(names) >= 3:
                found.append(names)
    return found


def test_pipeline_is_the_only_list_of_steps():
    sources = [p for folder in ("payloads", "hpctl", "tools") for p in (ROOT / folder).rglob("*.py")]
    lists = {str(p.relative_to(ROOT)): found for p in sources if (found := _step_lists(ast.parse(p.read_text())))}
    assert len(sources) > 100 and lists == {}
    old = 'STEPS = ("prepare", "download", "data", "precompile", "train", "consolidate", "merge")'
    assert _step_lists(ast.parse(old))  # the finder sees a list of step names


def test_the_chain_and_the_training_job_read_the_same_records():
    assert tuple(job.step for job in submit.PIPELINE if job.step != "gather") == submit.STEPS
    assert tuple(job.step for job in submit.PIPELINE) == sagemaker_job.STEPS
    assert sagemaker_job.LEADER_ONLY_STEPS == ("consolidate", "merge", "generate", "evaluate", "benchmark")
    assert tuple(job.step for job in submit.PIPELINE if job.multi_node) == sagemaker_job.COMPILING_STEPS
    assert submit.TRAINED_OUTPUTS == ("adapter", "merged", "generation.txt", "eval", "benchmark")
    for job in submit.PIPELINE:
        assert job.job_only or (ROOT / "payloads" / "slurm" / job.script).is_file()


def test_the_docs_name_the_steps_by_the_pipeline():
    package = (ROOT / "payloads" / "llm_pipeline" / "__init__.py").read_text()
    layout = (ROOT / "docs" / "README.md").read_text()
    assert "submit.PIPELINE" in package and "submit.PIPELINE" in layout


def test_a_training_job_runs_each_step_with_its_records_arguments(tmp_path):
    """A restarted training job rewrites what an earlier attempt left half done: its record says so (job_args)."""
    config, hosts = tmp_path / "run.toml", JobHosts(hosts=("algo-1",), current="algo-1")
    commands = {
        job.step: sagemaker_job.step_command(job.step, config, {}, hosts) for job in submit.PIPELINE if job.leader_only
    }
    assert commands["consolidate"][-4:] == ["llm_pipeline.consolidate", "--config", str(config), "--overwrite"]
    assert commands["merge"][-4:] == ["llm_pipeline.merge", "--config", str(config), "--overwrite"]
    assert commands["evaluate"][-3:] == ["llm_pipeline.evaluate", "--config", str(config)]


def test_the_benchmark_step_is_in_the_chain_of_a_run_that_asks_for_tasks(tmp_path):
    """benchmark.tasks decides (BenchmarkConfig.runs): a run without tasks pays nothing for the step, in the Slurm
    chain and in a training job; the step gets no smoke copy, and the estimate says why it has no figure."""
    plain = tmp_path / "plain.toml"
    plain.write_text("")
    asked = tmp_path / "asked.toml"
    asked.write_text('[benchmark]\ntasks = ["arc_challenge:25"]\n')
    without, with_tasks = (config.load(path) for path in (plain, asked))
    assert [job.step for job in submit.pipeline_jobs("evaluate", without)] == ["evaluate"]
    assert [job.step for job in submit.pipeline_jobs("evaluate", with_tasks)] == ["evaluate", "benchmark"]
    with pytest.raises(SubmitError, match="--from benchmark: the run config asks for none of benchmark"):
        submit.pipeline_jobs("benchmark", without)
    hosts = JobHosts(hosts=("algo-1",), current="algo-1")
    planned = sagemaker_job.job_plan(plain, without, "merge", hosts, smoke_stage=False)
    assert [job.step for job, _ in planned] == ["merge", "generate", "evaluate"]
    assert "nothing to do" in sagemaker_job.step_command("benchmark", asked, {}, hosts)
    facts = RunFacts(config=asked, output_dir=tmp_path / "run", nodes=1, run=with_tasks)
    staged = [job.step for job, _ in staged_chain(facts, submit.pipeline_jobs("train", with_tasks), smoke_stage=True)]
    assert "benchmark" in staged and "smoke-benchmark" not in staged and "smoke-evaluate" in staged
    # download.sbatch asks the same rule on the host's python3 before it fetches the tasks' datasets
    wanted = [sys.executable, "-m", "llm_pipeline.benchmark", "--wanted", "--config"]
    payloads = Path(sagemaker_job.__file__).parents[1]
    codes = [subprocess.run([*wanted, str(path)], cwd=payloads).returncode for path in (plain, asked)]
    assert codes == [1, 0]


def test_a_run_that_needs_vllm_is_refused_at_submit_where_the_nodes_have_none(tmp_path):
    """benchmark.tasks or GRPO on the Pyxis runtime (the training images carry no vLLM yet): one line at submit;
    on a host runtime (the rehearsal's vLLM site) and for a run that starts no server, nothing."""
    asked = tmp_path / "asked.toml"
    asked.write_text('[benchmark]\ntasks = ["arc_challenge:25"]\n')
    grpo = tmp_path / "grpo.toml"
    grpo.write_text('[train]\nobjective = "grpo"\n[data]\npacking = false\n')
    plain = tmp_path / "plain.toml"
    plain.write_text("")
    facts = {
        path.stem: RunFacts(config=path, output_dir=tmp_path / path.stem, nodes=1, run=config.load(path))
        for path in (asked, grpo, plain)
    }
    pyxis, host = {"HPL_RUNTIME": "pyxis"}, {"HPL_RUNTIME": "host"}
    with pytest.raises(SubmitError, match=r"^benchmark.tasks need\(s\) a vLLM server on the nodes"):
        check_vllm_on_the_nodes(facts["asked"], pyxis)
    with pytest.raises(SubmitError, match=r"^train.objective = 'grpo' need\(s\) a vLLM server"):
        check_vllm_on_the_nodes(facts["grpo"], pyxis)
    check_vllm_on_the_nodes(facts["plain"], pyxis)
    for found in facts.values():
        check_vllm_on_the_nodes(found, host)
