"""What a Slurm job's Python processes import before they work. Each step of a chain is a fresh process: a
training library imported where it is not used costs seconds per job (peft alone, through bitsandbytes, takes
several), so the host-side helpers stay stdlib only and the step modules load the training stack only on the
branches that use it. Checked in fresh interpreters: what ``import`` alone loads, and what a consolidate run loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from merge_fixtures import Shape, full_adapter
from nxd_files import run_config, write_plain_checkpoint

import llm_pipeline

PAYLOADS = Path(llm_pipeline.__file__).parents[1]
TRAINING_STACK = ("torch", "transformers", "trl", "peft", "datasets", "bitsandbytes", "accelerate")
# Every step reads its run config and writes its markers through these.
CONFIG_LAYER = ("config", "run_files", "run_state", "cli", "errors")
HOST_PYTHON_RUN = re.compile(r'(?:HPL_HOST_PYTHON"|python3\}?"?) -m llm_pipeline\.([\w.]+)')


def host_python_modules() -> list[str]:
    """The modules a job or the controller runs on the node's own python3 (no site packages): what the Slurm
    scripts start with $HPL_HOST_PYTHON or python3, every jobs/ module (stdlib only), the controller's entry
    points, and the config layer under them."""
    scripts = "\n".join(path.read_text() for path in sorted((PAYLOADS / "slurm").iterdir()))
    found = set(HOST_PYTHON_RUN.findall(scripts)) | set(CONFIG_LAYER)
    found |= {f"jobs.{path.stem}" for path in (PAYLOADS / "llm_pipeline" / "jobs").glob("*.py")}
    found |= {module for module, (_, lanes) in llm_pipeline.ENTRY_POINTS.items() if "controller" in lanes}
    return sorted(found - {"jobs.__init__"})


def step_modules() -> list[str]:
    """Every other entry point: run on the step's Python, which has the training stack installed."""
    return sorted(set(llm_pipeline.ENTRY_POINTS) - set(host_python_modules()))


# In the child (argv: the libraries, comma-separated, then the modules): import each module in turn and name the
# libraries it added; one interpreter for a whole list (a library is charged to the first module that loads it).
IMPORT_EACH = """
import importlib, json, sys
stack, found = sys.argv[1].split(","), {}
for module in sys.argv[2:]:
    before = {m for m in stack if m in sys.modules}
    try:
        importlib.import_module(module)
    except ImportError as exc:
        found[module] = f"ImportError: {exc}"
        continue
    added = sorted(m for m in stack if m in sys.modules and m not in before)
    if added:
        found[module] = added
print(json.dumps(found))
"""
# In the child (argv: the libraries, then a step's arguments): run consolidate, name the libraries it loaded.
CONSOLIDATE = """
import json, sys
from llm_pipeline import consolidate
status = consolidate.main(sys.argv[2:])
print(json.dumps([status, [m for m in sys.argv[1].split(",") if m in sys.modules]]))
"""


def run_child(code: str, *args: str, bare: bool = False):
    """The JSON ``code`` prints last, run in a fresh interpreter with the training libraries as its first argument;
    ``bare``: without site packages, as the node's python3 runs (a third-party import fails there)."""
    env = dict(os.environ, PYTHONPATH=str(PAYLOADS))
    command = [sys.executable, *(["-S"] if bare else []), "-c", code, ",".join(TRAINING_STACK), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def training_imports(modules: list[str], *, bare: bool = False) -> dict[str, object]:
    """{module: the training libraries its import loaded}, for the modules whose import loads any."""
    return run_child(IMPORT_EACH, *(f"llm_pipeline.{m}" for m in modules), bare=bare)


def test_the_lists_hold_what_each_job_runs():
    host = host_python_modules()
    assert {"jobs.alerts", "jobs.health", "jobs.recovery", "rollout_server", "benchmark", "submit"} <= set(host)
    assert {"prepare", "download", "data", "train", "consolidate", "merge", "generate", "evaluate"} <= set(
        step_modules()
    )


def test_the_host_side_helpers_import_on_a_bare_python():
    assert training_imports(host_python_modules(), bare=True) == {}


def test_the_step_modules_import_no_training_library_until_they_run():
    assert training_imports(step_modules()) == {}


def test_consolidating_a_plain_adapter_imports_no_torch(tmp_path):
    # The torch backend's adapter is checked and copied (safetensors headers read by hand): the consolidate job
    # of every adapter run needs no tensor library. The config holds the keys consolidate reads (peft writes
    # more; merge_fixtures.adapter_config builds them all, through peft, whose import alone takes seconds).
    targets = ("q_proj", "v_proj")
    lora = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": list(targets)}
    write_plain_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint-3", full_adapter(Shape(), targets), lora)
    config = run_config(tmp_path, tmp_path / "run")
    checkpoints = tmp_path / "run" / "checkpoints"
    assert run_child(CONSOLIDATE, "--config", str(config), "--checkpoint", str(checkpoints)) == [0, []]
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
