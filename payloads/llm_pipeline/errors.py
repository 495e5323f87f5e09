"""The pipeline's exceptions have one root: each says what cannot go on and what to do.

Every exception class of the package derives from ``PipelineError`` (keeping the builtin base its
callers catch), so every entry point (each step CLI through cli.run_step, the submitters through
jobs/chain.run_submitter, sagemaker_job.main, the jobs/ CLIs) catches it once, prints one
``error: ...`` line and exits 2. Stdlib only: the host-side modules (jobs/) import this on the
controller's Python 3.10.
"""


class PipelineError(Exception):
    """Bad input or state the pipeline cannot go on with; the message names the thing and the fix."""


class StepError(PipelineError, RuntimeError):
    """Bad input or state for a pipeline step; the message names the thing and the fix."""


class CheckpointError(StepError):
    """A checkpoint, adapter or model folder that cannot be used as given (missing rank file,
    truncated safetensors file, adapter of another model, output folder in the way)."""
