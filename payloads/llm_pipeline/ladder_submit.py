"""Submit the torchtitan ladder as chained Slurm jobs (`python3 -m llm_pipeline.submit ladder`).

    prepare -> tokenizer -> dataset -> rung-<r> for each of torchtitan.rungs -> report -> export

prepare is the pipeline's own first step (with Pyxis it imports the image of the partition the
ladder runs on into FSx; then the run config validates and the training stack imports there).

Each job after the previous one succeeded (afterok; a failed job cancels the rest). The rungs run
on `[parallel] nodes` nodes (payloads/slurm/ladder-rung.sbatch <rung>), the other jobs on one.
The record and the step markers are the pipeline's (<run>/logs/pipeline.json, logs/state/), so
`submit status` and `--wait` follow a ladder as they follow the pipeline.
Controller side: Python 3.10 stdlib only; the rungs are the loaded run config's (jobs/run_facts).
"""

from __future__ import annotations

from llm_pipeline.config import RUNG_CHECKPOINT_FORMATS
from llm_pipeline.jobs import chain
from llm_pipeline.jobs.chain import ChainJob
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts


def resumed_rungs(rungs: tuple[str, ...]) -> tuple[str, ...]:
    """The rungs whose smoke run also resumes (stops after its save, then a second job goes on from it): the
    first rung of each checkpoint format (config.RUNG_CHECKPOINT_FORMATS). A resume loads what the rung
    saved; rungs of one format save and load the same tensors under the same names, so one resume per
    format proves that load path for all of them, for one more rung start-up instead of one per rung."""
    first = {}
    for rung in rungs:
        first.setdefault(RUNG_CHECKPOINT_FORMATS[rung], rung)
    return tuple(first.values())


def ladder_jobs(rungs: tuple[str, ...]) -> list[ChainJob]:
    return [
        # Run once: the image, the tokenizer and the staged dataset serve the smoke run and the long one.
        ChainJob(step="prepare", script="prepare.sbatch", args=("--ladder",), shared=True),
        ChainJob(step="tokenizer", script="ladder-tokenizer.sbatch", shared=True),
        ChainJob(step="dataset", script="ladder-dataset.sbatch", shared=True),
        *(
            ChainJob(
                step=f"rung-{rung}",
                script="ladder-rung.sbatch",
                args=(rung,),
                multi_node=True,
                trains=True,
                resumes=rung in resumed_rungs(rungs),
            )
            for rung in rungs
        ),
        ChainJob(step="report", script="ladder-report.sbatch"),
        ChainJob(step="export", script="ladder-export.sbatch"),
    ]


def dry_run(facts: RunFacts, env: dict[str, str], *, smoke_stage: bool = True) -> None:
    """The ladder submission as a shell script: each job id captured and fed to the next dependency."""
    jobs = ladder_jobs(facts.run.torchtitan.rungs)
    chain.dry_run(facts, jobs, env, what="ladder submission", smoke_stage=smoke_stage)


def submit(facts: RunFacts, env: dict[str, str], *, smoke_stage: bool = True) -> list[StepJob]:
    """Submit the whole ladder (after its smoke stage unless ``smoke_stage`` is off); on a refused
    submission, cancel what this call submitted."""
    with chain.one_chain(facts):
        return chain.submit_chain(facts, ladder_jobs(facts.run.torchtitan.rungs), env, smoke_stage=smoke_stage)
