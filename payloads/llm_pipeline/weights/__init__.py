"""Everything that reads or writes model and adapter files: safetensors headers, float codec,
model and adapter folders, tensor-parallel layouts, the xser reader, the streaming merge and
atomic output folders.

May import: the stdlib, numpy, safetensors, and torch only in the modules that read or write tensors
with it (a step imports those on the branch that needs them: the merge and a plain adapter's
consolidation run without torch; tests/payloads/test_step_imports.py); from this package only errors
and model_shapes. Never the training stack.
"""
