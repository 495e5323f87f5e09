"""The pipeline's own exception: a step cannot go on, and the message says what to do."""


class StepError(RuntimeError):
    """Bad input or state for a pipeline step; the message names the thing and the fix."""
