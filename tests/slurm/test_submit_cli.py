"""submit without a cluster: the chain it would submit, what it reads from the run config, its
errors, and that it runs on the HyperPod controller's python3 (3.10, stdlib only, no tomllib)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, RUN_STEPS

from llm_pipeline import config as run_config
from llm_pipeline import run_state
from llm_pipeline.errors import PipelineError
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.submit import REPLACED_FOLDER, TRAINED_OUTPUTS, check_earlier_outputs, move_aside, submit

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-submit_cli")]
PAYLOADS = REPO / "payloads"
CONTROLLER_SIDE = (
    "submit",
    "ladder_submit",
    "sweep",
    "config",
    "errors",
    "jobs",
    "run_files",
    "run_state",
    "weights",
    "weights.checkpoints",
    "jobs.run_config_text",
    "jobs.run_facts",
    "jobs.pipeline_status",
    "jobs.launch",
    "jobs.deploy_facts",
    "jobs.partitions",
    "jobs.chain",
    "jobs.run_lock",
    "jobs.smoke",
    "jobs.sweep_plan",
    "jobs.estimate",
    "jobs.accounts",
)


def constrained_submit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """python3 -S (no site-packages: stdlib only) with tomllib made unimportable, as on Python 3.10."""
    code = (
        "import runpy, sys; sys.modules['tomllib'] = None; "
        f"sys.path.insert(0, {str(PAYLOADS)!r}); sys.argv = ['submit', *sys.argv[1:]]; "
        "runpy.run_module('llm_pipeline.submit', run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-S", "-c", code, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def is_type_checking_block(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING"


@pytest.mark.parametrize("module", CONTROLLER_SIDE)
def test_controller_side_modules_are_python_3_10_stdlib(module):
    path = PAYLOADS / "llm_pipeline" / module.replace(".", "/")
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
    tree = ast.parse(source, feature_version=(3, 10))  # a 3.11-only construct fails here
    # Import-time dependencies only: config.load imports tomllib lazily, and tomli from the shipped wheel where
    # it is missing (constrained_submit runs submit with tomllib blocked).
    # (an `if TYPE_CHECKING:` block is for the type checker, never run)
    module_level = [
        n
        for stmt in tree.body
        if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and not is_type_checking_block(stmt)
        for n in ast.walk(stmt)
    ]
    for node in module_level:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
        for name in names:
            top = name.split(".")[0]
            assert top != "tomllib", f"{module} imports tomllib"
            assert (
                top in sys.stdlib_module_names
                or name in (f"llm_pipeline.{m}" for m in CONTROLLER_SIDE)
                or name in ("llm_pipeline", "__future__")
            ), f"{module} imports {name}"


def script_lines(dry_run: str) -> list[str]:
    """The dry run's script, from its `# the same ... as a script:` line (the table of jobs comes before it)."""
    lines = dry_run.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("# the same ")) :]


def test_dry_run_prints_the_chain_without_tomllib_or_site_packages(tmp_path):
    config = write(
        tmp_path, '[paths]\noutput_dir = "${HPL_OUTPUTS_DIR:-/unused}/run-a"  # the run\n[parallel]\nnodes = 4\n'
    )
    out = constrained_submit(
        "--config", str(config), "--dry-run", "--no-smoke", env={"HPL_OUTPUTS_DIR": str(tmp_path / "outputs")}
    )
    assert out.returncode == 0, out.stderr
    lines = script_lines(out.stdout)
    assert lines[1] == f"mkdir -p {tmp_path}/outputs/run-a/logs/state"
    jobs = lines[2:]
    assert [line.split("=", 1)[0] for line in jobs] == [f"{step}_job" for step in RUN_STEPS]
    for previous, step, line in zip((None, *RUN_STEPS[:-1]), RUN_STEPS, jobs, strict=True):
        assert f"--job-name=hpl-{step} " in line and line.endswith(f"{PAYLOADS}/slurm/{step}.sbatch)")
        assert f"--output={tmp_path}/outputs/run-a/logs/{step}-%j.log" in line
        assert f"--nodes={4 if step in ('precompile', 'train') else 1} " in line
        assert (
            f"HPL_RUN_CONFIG={config}," in line
            and f"HPL_RUN_DIR={tmp_path}/outputs/run-a,HPL_CHAIN_STEP={step} " in line
        )
        if previous:
            assert f'--dependency=afterok:"${previous}_job" --kill-on-invalid-dep=yes' in line
        else:
            assert "--dependency" not in line
    assert not (tmp_path / "outputs").exists()  # a dry run creates nothing


def test_dry_run_from_a_step_starts_the_chain_there(tmp_path):
    out = constrained_submit(
        "--config", str(write(tmp_path, "")), "--dry-run", "--from", "train", env={"HPL_OUTPUTS_DIR": str(tmp_path)}
    )
    jobs = script_lines(out.stdout)[3:]
    long = ["train", "consolidate", "merge", "generate", "evaluate"]
    smoke = [
        "smoke_train",
        "smoke_train_resume",
        "smoke_consolidate",
        "smoke_merge",
        "smoke_generate",
        "smoke_evaluate",
    ]
    assert [line.split("=", 1)[0] for line in jobs] == [f"{job}_job" for job in (*smoke, "estimate", *long)]
    assert "--dependency" not in jobs[0] and '--dependency=afterok:"$smoke_train_job"' in jobs[1]
    assert '--dependency=afterok:"$estimate_job"' in jobs[7]
    # after training there is no smoke stage: nothing to resume from, nothing long to protect
    out = constrained_submit(
        "--config", str(write(tmp_path, "")), "--dry-run", "--from", "merge", env={"HPL_OUTPUTS_DIR": str(tmp_path)}
    )
    assert [line.split("=", 1)[0] for line in script_lines(out.stdout)[2:]] == [
        "merge_job",
        "generate_job",
        "evaluate_job",
    ]


def test_dry_run_to_a_step_stops_the_chain_and_its_smoke_stage_there(tmp_path):
    env = {"HPL_OUTPUTS_DIR": str(tmp_path)}
    config = str(write(tmp_path, ""))
    out = constrained_submit("--config", config, "--dry-run", "--from", "train", "--to", "merge", env=env)
    assert out.returncode == 0, out.stderr
    smoke = ["smoke_train", "smoke_train_resume", "smoke_consolidate", "smoke_merge"]
    long = ["train", "consolidate", "merge"]
    assert [line.split("=", 1)[0] for line in script_lines(out.stdout)[3:]] == [
        f"{job}_job" for job in (*smoke, "estimate", *long)
    ]
    # a --to before --from: refused in one line, before anything is printed or submitted
    refused = constrained_submit("--config", config, "--dry-run", "--from", "merge", "--to", "train", env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == "error: --to train: comes before --from merge; give a step from merge on"


def test_a_chain_that_trains_refuses_an_earlier_trainings_outputs_in_seconds(tmp_path):
    """A finished run extended with --from train: refused at submit, naming the outputs and the flag,
    where before consolidate failed after the whole training on the existing adapter/."""
    config = write(tmp_path, "")
    run = tmp_path / "llama3-8b-dolly-lora"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"step 30")
    (run / "generation.txt").write_text("answer of step 30")
    env = {"HPL_OUTPUTS_DIR": str(tmp_path)}
    refused = constrained_submit("--config", str(config), "--dry-run", "--from", "train", env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"error: {run} holds outputs of an earlier training (adapter, generation.txt), which the steps after "
        f"train would not replace: add --replace-outputs to move them aside into {run / REPLACED_FOLDER}/<time>/ "
        "before the chain starts"
    )
    allowed = constrained_submit("--config", str(config), "--dry-run", "--from", "train", "--replace-outputs", env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert f"# first: move {run / 'adapter'} aside" in allowed.stdout and (run / "adapter").is_dir()  # dry: kept
    # a chain after train works on the checkpoint those outputs came from: not refused
    assert constrained_submit("--config", str(config), "--dry-run", "--from", "merge", env=env).returncode == 0


def test_replace_outputs_moves_each_output_aside_whole(tmp_path):
    run = tmp_path / "run"
    for name in TRAINED_OUTPUTS:
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if "." in name:
            path.write_text(name)
        else:
            path.mkdir()
            (path / "file").write_text(name)
    (run / "checkpoints").mkdir()
    facts = read_run_facts(write(tmp_path, f'[paths]\noutput_dir = "{run}"\n'), {})
    assert check_earlier_outputs(facts, "merge", replace=False) == []
    target = move_aside(facts, check_earlier_outputs(facts, "prepare", replace=True))
    assert target.parent == run / REPLACED_FOLDER
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", REPLACED_FOLDER]
    assert {p.name: (p / "file" if p.is_dir() else p).read_text() for p in target.iterdir()} == {
        name: name for name in TRAINED_OUTPUTS
    }


def test_a_to_before_from_is_refused_before_any_output_moves_aside(tmp_path):
    """submit itself (not only its dry run): the chain's steps are checked first, so --replace-outputs has
    moved nothing and no capacity was claimed when a --to before --from is refused."""
    run = tmp_path / "run"
    (run / "merged").mkdir(parents=True)
    facts = read_run_facts(write(tmp_path, f'[paths]\noutput_dir = "{run}"\n'), {})
    with pytest.raises(PipelineError, match=r"^--to data: comes before --from train"):
        submit(facts, "train", {}, replace_outputs=True, last="data")
    assert (run / "merged").is_dir() and not (run / REPLACED_FOLDER).exists()


def test_a_finished_run_with_other_learning_keys_is_refused_at_submit_or_its_checkpoints_moved_aside(tmp_path):
    """The controller holds the RunConfig: a chain that would train a finished run with other values of its
    learning keys stops at submit (not in train, after the smoke stage); --replace-outputs moves checkpoints/
    aside with the outputs after train, so the run trains anew."""
    run = tmp_path / "run"
    finished = write(tmp_path, f'[paths]\noutput_dir = "{run}"\n[train]\nmax_steps = 30\n', "finished.toml")
    checkpoints = read_run_facts(finished, {}).run.paths.checkpoints_dir
    (checkpoints / "checkpoint-30").mkdir(parents=True)
    run_state.record_finished(checkpoints, 30, read_run_facts(finished, {}).run.learned())
    (run / "adapter").mkdir()
    same = write(tmp_path, f'[paths]\noutput_dir = "{run}"\n[train]\nmax_steps = 30\nlogging_steps = 1\n', "same.toml")
    longer = write(tmp_path, f'[paths]\noutput_dir = "{run}"\n[train]\nmax_steps = 60\n', "longer.toml")
    for unchanged in (same, longer):  # nothing learned changes, or an extension: the checkpoints stay
        assert check_earlier_outputs(read_run_facts(unchanged, {}), "train", replace=True) == [run / "adapter"]
    other = write(tmp_path, f'[paths]\noutput_dir = "{run}"\n[train]\nmax_steps = 30\nlearning_rate = 1e-4\n')
    facts = read_run_facts(other, {})
    with pytest.raises(
        PipelineError, match=r"train\.learning_rate \(finished with 2e-05, now 0\.0001\).*--replace-outputs"
    ):
        check_earlier_outputs(facts, "prepare", replace=False)
    # after train nothing is trained, and the finished checkpoint is not what this config trains: refused, not shipped
    with pytest.raises(PipelineError, match=r"submit --from merge would ship checkpoint-30.*train\.learning_rate"):
        check_earlier_outputs(facts, "merge", replace=False)
    target = move_aside(facts, check_earlier_outputs(facts, "train", replace=True))
    assert sorted(p.name for p in target.iterdir()) == ["adapter", "checkpoints"]
    assert (target / "checkpoints" / "checkpoint-30").is_dir() and not checkpoints.exists()
    assert check_earlier_outputs(facts, "train", replace=False) == []  # a fresh run now


def test_dry_run_stages_the_smoke_run_before_the_long_steps(tmp_path):
    config = write(tmp_path, '[paths]\noutput_dir = "run-a"\n[parallel]\nnodes = 4\n')
    out = constrained_submit("--config", str(config), "--dry-run")
    assert out.returncode == 0, out.stderr
    run, smoke = tmp_path / "run-a", tmp_path / "run-a" / "smoke"
    assert script_lines(out.stdout)[2] == f"# first: {smoke}/ with save.toml and run.toml (the smoke run's configs)"
    jobs = {line.split("=", 1)[0][: -len("_job")]: line for line in script_lines(out.stdout)[3:]}
    assert list(jobs)[:3] == ["prepare", "download", "data"]  # once: their output serves both runs
    assert list(jobs)[3:10] == ["smoke_precompile", "smoke_train", "smoke_train_resume", *(
        f"smoke_{step}" for step in ("consolidate", "merge", "generate", "evaluate"))]  # fmt: skip
    assert list(jobs)[10:] == ["estimate", "precompile", "train", "consolidate", "merge", "generate", "evaluate"]
    assert f"HPL_RUN_CONFIG={smoke}/save.toml," in jobs["smoke_train"]
    assert f"HPL_RUN_CONFIG={smoke}/run.toml," in jobs["smoke_train_resume"]
    for name in ("smoke_train", "smoke_train_resume", "smoke_precompile"):  # the run's node count
        assert "--nodes=4 " in jobs[name] and f"HPL_RUN_DIR={smoke}," in jobs[name]
    step = "smoke-train-resume"
    assert (
        f"--output={smoke}/logs/{step}-%j.log" in jobs["smoke_train_resume"]
        and f"HPL_CHAIN_STEP={step} " in (jobs["smoke_train_resume"])
    )
    assert f"HPL_RUN_CONFIG={config}," in jobs["estimate"] and f"HPL_RUN_DIR={run}," in jobs["estimate"]
    assert not run.exists()  # a dry run creates nothing


@pytest.mark.parametrize("name", ["default.toml", "tiny-cpu.toml"])
def test_run_folder_agrees_with_the_full_config_loader(name, tmp_path):
    env = {"HPL_OUTPUTS_DIR": str(tmp_path / "out"), "HPL_MODELS_DIR": "/m", "HPL_DATASETS_DIR": "/d"}
    path = PAYLOADS / "configs" / name
    cfg = run_config.load(path, env=env)
    facts = read_run_facts(path, env)
    assert (str(facts.output_dir), facts.nodes) == (cfg.paths.output_dir, cfg.parallel.nodes)


def test_defaults_and_relative_paths_follow_config_py(tmp_path):
    env = {"HPL_OUTPUTS_DIR": "/x"}
    empty = write(tmp_path, "[model]\nid = 'a'\n")
    assert str(read_run_facts(empty, env).output_dir) == run_config.load(empty, env=env).paths.output_dir
    relative = write(tmp_path, "[paths]\noutput_dir = 'runs/b'\n[parallel]\nnodes = 2\n", "rel.toml")
    facts = read_run_facts(relative, env)
    assert str(facts.output_dir) == run_config.load(relative, env=env).paths.output_dir == str(tmp_path / "runs" / "b")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[paths]\noutput_dir = 3\n", "paths.output_dir: expected a string, got 3"),
        ("[parallel]\nnodes = 0\n", "parallel.nodes: invalid value 0 (allowed: >= 1)"),
        ('[train]\nbackend = "neuron"\nmethod = "qlora"\n', "train.method: 'qlora' cannot run on the neuron backend"),
        ("[paths]\noutput_dir = '${NOT_SET_ANYWHERE}/x'\n", "environment variable NOT_SET_ANYWHERE is not set"),
    ],
)
def test_bad_run_config_values_are_named(tmp_path, text, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        read_run_facts(write(tmp_path, text), {})


def test_cli_errors_are_one_line(tmp_path):
    missing = constrained_submit("--config", str(tmp_path / "nope.toml"))
    assert (missing.returncode, missing.stderr) == (2, f"error: run config {tmp_path / 'nope.toml'} does not exist\n")

    config = write(tmp_path, f"[paths]\noutput_dir = '{tmp_path}/run'\n")
    status = constrained_submit("status", "--config", str(config))
    assert status.returncode == 2 and status.stderr.startswith(f"error: no pipeline submitted for {tmp_path}/run")

    no_slurm = constrained_submit("--config", str(config), env={"PATH": str(tmp_path)})
    assert no_slurm.returncode == 2
    assert no_slurm.stderr == "error: sbatch not found: run this on the cluster's controller or login node\n"

    # Without tomllib the controller reads with tomli (the shipped wheel): any TOML, and a refusal in one line.
    several = write(tmp_path, '[torchtitan]\nrungs = [\n  "baseline",\n]\n', "several.toml")
    out = constrained_submit("--config", str(several), "--dry-run")
    assert out.returncode == 0, out.stderr
    broken = write(tmp_path, "[train]\nmax_steps = 030\n", "broken.toml")
    out = constrained_submit("--config", str(broken), "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"error: run config {broken} is not valid TOML: ")

    comma = write(tmp_path, f"[paths]\noutput_dir = '{tmp_path}/a,b'\n", "comma.toml")
    out = constrained_submit("--config", str(comma), "--dry-run")
    assert out.returncode == 2 and "contains a comma" in out.stderr


def test_scripts_are_shellcheck_clean():
    scripts = [*sorted((PAYLOADS / "slurm").glob("*.sbatch")), *sorted((PAYLOADS / "slurm").glob("*.sh"))]
    scripts += sorted(Path(__file__).parent.glob("*.sbatch"))
    assert len(scripts) >= 9
    shellcheck = Path(sys.executable).with_name("shellcheck")
    out = subprocess.run([str(shellcheck), "-x", *map(str, scripts)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
