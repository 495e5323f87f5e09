"""The pipeline's steps are one list of records (submit.PIPELINE): submit, sagemaker_job and hpctl read it,
and no module keeps a list of step names of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from llm_pipeline import config, sagemaker_job, submit
from llm_pipeline.jobs import serving_image
from llm_pipeline.jobs.chain import SubmitError, staged_chain
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.jobs.sagemaker_env import JobHosts
from llm_pipeline.jobs.serving_image import ServingImageError

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


def test_a_run_that_serves_needs_the_partitions_serving_image_under_pyxis(tmp_path):
    """benchmark.tasks or GRPO on the Pyxis runtime run vLLM in the partition's serving image: refused in one line at
    submit when the deploy facts name none (a deploy before serving images) and for GRPO on Trainium; nothing on a
    host runtime (the rehearsal's vLLM site) or for a run that starts no server. The prepare step asks the same
    rule (--needed) before it imports the serving image."""
    asked = tmp_path / "asked.toml"
    asked.write_text('[benchmark]\ntasks = ["arc_challenge:25"]\n')
    grpo = tmp_path / "grpo.toml"
    grpo.write_text('[train]\nobjective = "grpo"\n[data]\npacking = false\n')
    plain = tmp_path / "plain.toml"
    plain.write_text("")
    broken = tmp_path / "broken.toml"
    broken.write_text("[train]\nobjective = 3\n")
    runs = {path.stem: config.load(path) for path in (asked, grpo, plain)}
    assert {name: serving_image.vllm_uses(run) for name, run in runs.items()} == {
        "asked": ["benchmark.tasks"],
        "grpo": ["train.objective = 'grpo'"],
        "plain": [],
    }
    gpu = {"HPL_RUNTIME": "pyxis", "HPL_PARTITION": "gpu", "HPL_ACCELERATOR": "cuda"}
    served = {**gpu, "HPL_SERVING_IMAGE_URI": "1.dkr.ecr.us-west-2.amazonaws.com/assets:serve"}

    def check(name, env):
        run = runs[name]
        serving_image.check_serving(serving_image.vllm_uses(run), env, grpo=run.train.objective == "grpo")

    with pytest.raises(
        ServingImageError,
        match=r"^benchmark.tasks start\(s\) a vLLM server on the nodes, and "
        r"partition gpu has no serving image .*deploy again \(make deploy\)",
    ):
        check("asked", gpu)
    with pytest.raises(ServingImageError, match=r"^train.objective = 'grpo' start\(s\)"):
        check("grpo", gpu)
    with pytest.raises(ServingImageError, match=r"^hpctl serve start\(s\)"):
        serving_image.check_serving(["hpctl serve"], gpu)
    trainium = {**served, "HPL_PARTITION": "trn", "HPL_ACCELERATOR": "neuron"}
    with pytest.raises(ServingImageError, match=r"^train.objective = 'grpo' on partition trn \(Trainium\)"):
        check("grpo", trainium)
    check("asked", trainium)  # the benchmark step serves on Trainium (vLLM-Neuron)
    for name in runs:
        check(name, served)
        check(name, {"HPL_RUNTIME": "host"})
    check("plain", gpu)
    needed = [sys.executable, "-m", "llm_pipeline.jobs.serving_image", "--needed"]
    payloads = Path(sagemaker_job.__file__).parents[1]
    found = [
        subprocess.run([*needed, str(path)], cwd=payloads, capture_output=True, text=True)
        for path in (asked, grpo, plain, broken)
    ]
    assert [result.returncode for result in found] == [0, 0, 1, 2]
    assert found[3].stderr.startswith("error: ") and "train.objective" in found[3].stderr
    assert "Traceback" not in found[3].stderr
