"""The training pipeline that runs on the cluster (or in a SageMaker training job).

Step modules sit on top, one per Slurm step plus `submit`: ``python -m llm_pipeline.<step>``
(prepare, download, data, train, consolidate, merge, generate; precompile runs train). Shared by
every step: config (the run config), cli (the step command line), errors, prompt. Helpers live
in three subpackages, each stating what it may import:

- training/  the trainer glue: the plan, arguments, callbacks, one module per engine
- weights/   model and adapter files on disk: safetensors headers, TP shards, merge, atomic output
- jobs/      host side (Slurm submission, launch arguments, run status): stdlib only, Python 3.10
"""

__version__ = "0.1.0"  # the project version (pyproject.toml); `--version` on every step and on hpctl
