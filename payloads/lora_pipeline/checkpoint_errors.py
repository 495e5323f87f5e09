"""The error type of the consolidate and merge steps (a StepError, so every CLI reports it alike).

Raised for every bad input (a missing rank file, a truncated safetensors file, an adapter that
belongs to another model, an output folder that is in the way); the message names the file or
module and says what to do. The CLIs print it as ``error: ...`` and exit 2.
"""

from __future__ import annotations

from lora_pipeline.errors import StepError


class CheckpointError(StepError):
    """A checkpoint, adapter or model folder that cannot be used as given."""
