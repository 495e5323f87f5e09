"""The package's __init__ lists every entry point of the payload package (a module with a command
line), how it runs and its lanes; the Slurm scripts and the training job run only listed ones."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import llm_pipeline
from llm_pipeline import sagemaker_job

PACKAGE = Path(llm_pipeline.__file__).parent
LANES = {"controller", "slurm", "job", "node", "laptop"}


def runnable_modules() -> set[str]:
    """Modules under llm_pipeline with an `if __name__ == "__main__":` block."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
                found.add(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    return found


def test_every_entry_point_is_listed_with_how_it_runs_and_its_lanes():
    assert set(llm_pipeline.ENTRY_POINTS) == runnable_modules()
    for module, (how, lanes) in llm_pipeline.ENTRY_POINTS.items():
        assert how.strip() and lanes and set(lanes) <= LANES, module


def test_the_slurm_scripts_and_the_training_job_run_listed_entry_points_in_their_lane():
    lines = [
        line
        for path in (PACKAGE.parent / "slurm").glob("*.sbatch")
        for line in path.read_text().splitlines()
        if not line.startswith(("source", "#"))  # `source env.sh` names submit in its message
    ]
    run = {module for line in lines for module in re.findall(r"llm_pipeline\.([\w.]+)", line)}
    assert run and all("slurm" in llm_pipeline.ENTRY_POINTS[module][1] for module in run), run
    # precompile: train --precompile; benchmark: a training job skips it (its image holds no vLLM)
    job_steps = set(sagemaker_job.STEPS) - {"precompile", "benchmark"}
    assert all("job" in llm_pipeline.ENTRY_POINTS[step][1] for step in job_steps), job_steps
