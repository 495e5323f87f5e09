"""The training pipeline that runs on the cluster (or in a SageMaker training job).

Step modules sit on top, one per step of ``submit.PIPELINE`` (the one list of the pipeline's steps, in order;
precompile runs train, gather is a training job's) plus ``submit``: ``python -m llm_pipeline.<step>``. Shared by
every step: config (the run config), cli (the step command line), errors (one root, PipelineError),
prompt, run_files (every line and file a run leaves for another program). Helpers live in three
subpackages, each stating what it may import:

- training/  the trainer glue: the plan, arguments, callbacks, one module per engine
- weights/   model and adapter files on disk: safetensors headers, TP shards, merge, atomic output
- jobs/      host side (Slurm submission, launch arguments, run status): stdlib only, Python 3.10

Every entry point (a module with a command line), how it runs and in which lane, is in
``ENTRY_POINTS`` below; tests/payloads/test_entry_points.py keeps it true. Lanes: ``controller``
(the HyperPod controller's python3 3.10, stdlib only), ``slurm`` (a Slurm job's step, on the compute
nodes), ``job`` (inside a SageMaker training job), ``node`` (by hand on a cluster node), ``laptop`` (by hand,
or through hpctl).
"""

__version__ = "0.1.0"  # the project version (pyproject.toml); `--version` on every step and on hpctl

# module under llm_pipeline: (how it runs, its lanes)
ENTRY_POINTS = {
    "submit": ("python3 -m llm_pipeline.submit --config RUN.toml [status|ladder]", ("controller",)),
    "sweep": ("python3 -m llm_pipeline.sweep --config RUN.toml --nodes 1,2,4", ("controller",)),
    "prepare": (
        "hpl_step_python (prepare.sbatch); a job step: checks the host, the image, the config",
        ("slurm", "job"),
    ),
    "download": ("hpl_step_python (download.sbatch); a job step (sagemaker_job)", ("slurm", "job")),
    "data": ("hpl_step_python (data.sbatch); a job step", ("slurm", "job")),
    "train": ("hpl_torchrun (train.sbatch, precompile.sbatch --precompile); torchrun in a job", ("slurm", "job")),
    "gather": ("a job step after train when the job has several hosts", ("job",)),
    "consolidate": ("hpl_step_python (consolidate.sbatch); a job step on the first host", ("slurm", "job")),
    "merge": ("hpl_step_python (merge.sbatch); a job step on the first host", ("slurm", "job")),
    "generate": ("hpl_step_python (generate.sbatch); a job step on the first host", ("slurm", "job")),
    "evaluate": ("hpl_step_python (evaluate.sbatch); a job step on the first host", ("slurm", "job")),
    "benchmark": (
        "hpl_vllm_step_python (benchmark.sbatch; vLLM site or serving image): after merge if benchmark.tasks",
        ("slurm",),
    ),
    "pretrain": ("hpl_step_python llm_pipeline.pretrain tokenizer|dataset|job|retain|report|export", ("slurm",)),
    "config_show": ("python -m llm_pipeline.config_show RUN.toml: the run config as the steps see it", ("laptop",)),
    "compare": ("python -m llm_pipeline.compare RUN [RUN...] (hpctl run compare)", ("laptop", "slurm")),
    "charts": ("python -m llm_pipeline.charts scaling|ladder FOLDER (sweep_report.sbatch)", ("slurm", "laptop")),
    "compile_cache": ("python -m llm_pipeline.compile_cache --cache-dir DIR --uri S3 (by sagemaker_job)", ("job",)),
    "sagemaker_job": ("python3 -m llm_pipeline.sagemaker_job: a training job's entry (hpctl job submit)", ("job",)),
    "trn2_acceptance": (
        "python3 -m llm_pipeline.trn2_acceptance --report-dir DIR (host, in salloc -N 2): the trn2 acceptance; "
        "each level an srun into the image (--on-node there)",
        ("controller", "node"),
    ),
    "training.torchtitan.live_metrics": (
        "hpl_torchrun (ladder-rung.sbatch): runs torchtitan's trainer, its metric lines to node exporter",
        ("slurm",),
    ),
    "jobs.serving_image": (
        "python3 -m llm_pipeline.jobs.serving_image --needed RUN.toml (prepare.sbatch: import the serving image?)",
        ("slurm",),
    ),
    "jobs.estimate": ("python3 -m llm_pipeline.jobs.estimate (estimate.sbatch; a job step)", ("slurm", "job")),
    "jobs.capacity": (
        "python3 -m llm_pipeline.jobs.capacity wait|release (wait-capacity.sbatch, release-capacity.sbatch)",
        ("slurm",),
    ),
    "jobs.launch": ("python3 -m llm_pipeline.jobs.launch --exec -- PROGRAM (hpl_torchrun)", ("slurm", "job")),
    "jobs.scaling_report": ("python3 -m llm_pipeline.jobs.scaling_report --sweep-dir DIR (sweep_report)", ("slurm",)),
    "jobs.alerts": (
        "python3 -m llm_pipeline.jobs.alerts step-end|watch (env.sh: a step's end, train's stall watch)",
        ("slurm",),
    ),
    "jobs.recovery": ("python3 -m llm_pipeline.jobs.recovery attempt|failed|report (train.sbatch)", ("slurm",)),
    "jobs.drill": (
        "python3 -m llm_pipeline.jobs.drill kill-rank|fail-node --run-dir RUN (hpctl drill: root on the controller)",
        ("controller",),
    ),
    "serve": (
        "hpl_step_python (serve.sbatch), in the vLLM site: the run's model behind vLLM (hpctl serve)",
        ("slurm",),
    ),
    "jobs.health": (
        "python3 -m llm_pipeline.jobs.health gate (env.sh's hpl_health_gate: train, precompile, ladder rungs)",
        ("slurm",),
    ),
    "rollout_server": (
        "hpl_vllm_srun ... -m llm_pipeline.rollout_server (env.sh's hpl_rollout_start, train.sbatch of a GRPO run), "
        "in the vLLM site: the rollout server; --placement and --wait from the host",
        ("slurm",),
    ),
    "jobs.serve_job": (
        "python3 -m llm_pipeline.jobs.serve_job submit|stop --run-dir RUN (hpctl serve, on the controller)",
        ("controller",),
    ),
}
