"""The pipeline's exceptions, in one place: each says what cannot go on and what to do.

Every step CLI prints them as one ``error: ...`` line and exits 2 (see cli.py). Stdlib only: the
host-side modules (jobs/) import this on the controller's Python 3.10.
"""


class StepError(RuntimeError):
    """Bad input or state for a pipeline step; the message names the thing and the fix."""


class CheckpointError(StepError):
    """A checkpoint, adapter or model folder that cannot be used as given (missing rank file,
    truncated safetensors file, adapter of another model, output folder in the way)."""
