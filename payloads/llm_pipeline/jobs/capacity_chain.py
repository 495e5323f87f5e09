"""A chain's claim at its head and its release job at its tail (llm_pipeline.jobs.capacity), kept apart from
the chain's own submission so they move with it (stdlib only)."""

from __future__ import annotations

import sys

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import capacity, deploy_facts
from llm_pipeline.jobs.chain import PAYLOADS_DIR, ChainJob, SubmitError, slurm
from llm_pipeline.jobs.pipeline_status import StepJob
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import SLURM_JOB_ID, StepLog


def claim_for_chain(facts: RunFacts, env: dict[str, str]) -> str:
    """Claim the run's nodes on a group that scales with runs, before the first job; "" for any other group.
    The partition's scaling facts (deploy-facts.json) join ``env`` for the release job."""
    known, _ = deploy_facts.read_partitions(PAYLOADS_DIR)
    env.update({k: v for k, v in capacity.scaling_environment(known.get(env.get("HPL_PARTITION", ""), {})).items()})
    group = capacity.group_from_env(env)
    if group is None:
        return ""
    claim_id = capacity.claim(group, facts.nodes, capacity.make_scaler(env), capacity.claims_path(env, group))
    print(f"capacity: claimed {facts.nodes} node(s) of group {group.name} (claim {claim_id})", flush=True)
    return claim_id


def wait_job(facts: RunFacts) -> ChainJob:
    """The chain's first job: the claimed nodes up in Slurm, or a failed step naming the group and the missing
    count (shared: it runs once, before a smoke stage)."""
    script = f"{capacity.WAIT_STEP}.sbatch"
    return ChainJob(step=capacity.WAIT_STEP, script=script, args=("--nodes", str(facts.nodes)), shared=True)


def release_command(facts: RunFacts, claim_id: str, after: str, env: dict[str, str]) -> list[str]:
    command = [
        "sbatch",
        "--parsable",
        f"--job-name=hpl-{capacity.RELEASE_STEP}",
        f"--output={facts.logs_dir / StepLog(capacity.RELEASE_STEP, SLURM_JOB_ID).name}",
        "--nodes=1",
        f"--export={','.join(['ALL', *(f'{k}={v}' for k, v in release_environment(claim_id, env).items())])}",
        f"--dependency=afterany:{after}",
    ]
    if env.get("HPL_PARTITION"):
        command.append(f"--partition={env['HPL_PARTITION']}")
    return [*command, str(PAYLOADS_DIR / "slurm" / f"{capacity.RELEASE_STEP}.sbatch")]


def release_environment(claim_id: str, env: dict[str, str]) -> dict[str, str]:
    """What the release job needs: the claim, the group's scaling facts, where the claims live, the scaler."""
    names = (
        "HPL_PARTITION",
        *capacity.SCALE_ENV.values(),
        capacity.CLAIMS_DIR_VARIABLE,
        capacity.SCALER_VARIABLE,
        capacity.CLUSTER_VARIABLE,
        capacity.WAIT_VARIABLE,
        "HPL_FSX_MOUNT_PATH",
    )
    values = {name: env[name] for name in names if env.get(name)}
    return {capacity.CLAIM_VARIABLE: claim_id, "HPL_PAYLOADS_DIR": str(PAYLOADS_DIR), **values}


def submit_release(facts: RunFacts, claim_id: str, submitted: list[StepJob], env: dict[str, str]) -> str:
    """The release job after the chain's last job (any end); the job id. Without a chain, release at once. The
    chain's job ids (and the release job's) join the claim first, so a claim whose release job never ran (a refused
    sbatch, a dropped session) expires once they are gone from Slurm: the next claim or release on the group, or an
    admin's sweep, gives its nodes back."""
    if not claim_id:
        return ""
    if not submitted:
        give_back_now(claim_id, env)
        return ""
    group = capacity.group_from_env(env)
    path = capacity.claims_path(env, group) if group else None
    if path:
        capacity.record_jobs(path, claim_id, [job.job for job in submitted])
    out = slurm(release_command(facts, claim_id, submitted[-1].job, env))
    if out.returncode != 0:
        raise SubmitError(
            f"sbatch refused the capacity release job: {out.stderr.strip() or out.stdout.strip()}; the chain runs, "
            f"and its claim {claim_id} expires when its jobs are gone (the next claim or release on group "
            f"{group.name if group else '?'} gives its nodes back; `hpctl status --slurm` lists it)"
        )
    job_id = out.stdout.strip().split(";")[0]
    if path:
        capacity.record_jobs(path, claim_id, [job_id])
    print(f"capacity: {capacity.RELEASE_STEP} job {job_id} gives the nodes back after job {submitted[-1].job}")
    return job_id


def give_back_now(claim_id: str, env: dict[str, str]) -> None:
    """A refused submission: drop the claim here, so no node waits for a chain that never came."""
    group = capacity.group_from_env(env)
    if group is None or not claim_id:
        return
    try:
        capacity.release(
            group,
            claim_id,
            capacity.make_scaler(env),
            capacity.claims_path(env, group),
            busy=capacity.slurm_busy,
            drain=capacity.slurm_drain,
            resume=capacity.slurm_resume,
            tries=1,  # the submitter waits: a failed give-back stays with the claim for the next release
        )
    except StepError as error:  # the refusal that brought us here is the error to show; this one follows
        print(f"capacity: {error}", file=sys.stderr, flush=True)
