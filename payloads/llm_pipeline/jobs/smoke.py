"""The smoke stage: every chain proves its production path in minutes before its long steps start.

A chain's jobs (the pipeline's steps, the ladder's jobs) become three stages, each job after the
previous one succeeded (afterok: a failure anywhere cancels everything after it):

1. the shared jobs (``ChainJob.shared``: prepare, download, data; the ladder's prepare, tokenizer,
   dataset), once: their output (image, model, tokenized or staged data) serves both runs;
2. a smoke copy of every other job, named ``smoke-<step>``, on the run folder ``<run>/smoke`` with
   a derived run config (``<run>/smoke/run.toml``: the same config, partition and node count, step
   counts cut to SMOKE_STEPS). A resuming job (``ChainJob.resumes``: the pipeline's train) runs
   twice: ``smoke-<step>`` trains on the SMOKE_STEPS schedule, saves at SAVE_STEP and stops there
   (train.stop_after_step), ``smoke-<step>-resume`` resumes from that checkpoint to SMOKE_STEPS;
   the later smoke jobs (consolidate, merge, generate, evaluate) then work on a checkpoint written
   after a resume. A ladder rung trains SMOKE_STEPS steps with a full checkpoint at SAVE_STEP and
   its model-only last save, which the smoke export then loads; the rungs ladder_submit marks
   ``resumes`` (one per checkpoint format) run as two jobs too, the first stopping after its save.
   ``<run>/smoke/data`` links to the run's prepared data; the model and the compile cache live
   outside the run folder, so the smoke run fills the cache the long run reads;
3. ``estimate`` (llm_pipeline.jobs.estimate: each long step's duration and node-hours from the smoke
   run's measured step time), then the long jobs on the real run folder.

This module writes the smoke run folder and names its jobs; llm_pipeline.jobs.chain stages the chain.
Stdlib only (the controller's python3).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.jobs.run_config_text import write_derived
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import STATE_DIR

SMOKE_FOLDER = "smoke"  # <run>/smoke: the smoke run's own run folder
ESTIMATE_STEP = "estimate"  # payloads/slurm/estimate.sbatch, after the smoke stage
PREFIX = "smoke-"
RESUME_SUFFIX = "-resume"
SAVE_STEP = 2  # the first smoke training saves and stops here...
SMOKE_STEPS = 4  # ...and the resumed one trains on to here (steps 1 and 3 carry the warm-up)
# torchtitan keys a smoke rung adds to torchtitan.overrides: a metric line per step (the step time), and a
# full checkpoint before the last step (the last one holds the model only).
TORCHTITAN_SMOKE = ("metrics.log_freq = 1", f"checkpoint.interval = {SAVE_STEP}")
CONFIGS = ("save.toml", "run.toml")  # the saving smoke run's config, the whole smoke run's
SMOKE_NEW_TOKENS = 8  # generate: enough to prove the path
SMOKE_EVAL_ROWS = 8  # evaluate: held-out rows scored per model, and one answer
# Long jobs the smoke stage does not copy, each with why (the estimate prints it). The benchmark: its duration is its
# tasks', not a training's, a copy would start its vLLM servers twice, and it fails after merge with the tuned model
# kept (`submit --from benchmark` runs it again).
NOT_COPIED = {"benchmark": "not estimated: no smoke copy (its time is its tasks' and vLLM's start)"}
NO_SMOKE_RISK = (
    "--no-smoke: the long steps start without a smoke run. A defect in a late step (resume, consolidation, "
    "merge, export) then shows only after the long training was paid for, and no time or cost estimate is made"
)


def smoke_dir(facts: RunFacts) -> Path:
    return facts.output_dir / SMOKE_FOLDER


def smoke_overrides(cfg: RunConfig, stop_after_step: int = 0) -> dict[tuple[str, str], object]:
    """The run config's keys a smoke run changes: step counts only (and the profiler window, which
    the cut run never reaches). Every smoke run has the schedule of SMOKE_STEPS steps; the saving one
    ends after ``stop_after_step`` (train.stop_after_step, torchtitan.stop_after_step), so the run resumed
    from its checkpoint trains steps 3 and 4 at the learning rates an uninterrupted run would."""
    return {
        ("train", "max_steps"): SMOKE_STEPS,
        ("train", "stop_after_step"): stop_after_step,
        ("train", "save_steps"): SAVE_STEP,
        ("train", "logging_steps"): 1,  # a step time per step
        ("train", "profile"): "",
        ("generate", "max_new_tokens"): min(cfg.generate.max_new_tokens, SMOKE_NEW_TOKENS),
        ("torchtitan", "steps"): SMOKE_STEPS,
        ("torchtitan", "stop_after_step"): stop_after_step,
        ("torchtitan", "overrides"): [*cfg.torchtitan.overrides, *TORCHTITAN_SMOKE],
        ("eval", "max_samples"): SMOKE_EVAL_ROWS,
        ("eval", "answers"): 1,
    }


def write_smoke_run(facts: RunFacts) -> None:
    """A fresh <run>/smoke with its two run configs (CONFIGS: the run that stops after SAVE_STEP, the whole one).

    An earlier smoke run is removed: its checkpoints would be resumed instead of written."""
    folder = smoke_dir(facts)
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "logs" / STATE_DIR).mkdir(parents=True)
    (folder / "data").symlink_to(facts.output_dir / "data", target_is_directory=True)
    for name, stop in zip(CONFIGS, (SAVE_STEP, 0), strict=True):
        write_derived(facts.config, folder / name, smoke_overrides(facts.run, stop), run_dir=folder)


def copied(step: str) -> bool:
    """Whether the smoke stage runs a copy of the long job ``step`` (NOT_COPIED)."""
    return step not in NOT_COPIED


def is_smoke(step: str) -> bool:
    return step.startswith(PREFIX)


def long_step(step: str) -> str:
    """The long job a smoke job stands for: smoke-train-resume -> train."""
    name = step[len(PREFIX) :] if is_smoke(step) else step
    return name[: -len(RESUME_SUFFIX)] if name.endswith(RESUME_SUFFIX) else name
