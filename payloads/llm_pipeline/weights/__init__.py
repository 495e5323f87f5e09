"""Everything that reads or writes model and adapter files: safetensors headers, float codec,
model and adapter folders, tensor-parallel layouts, the xser reader, the streaming merge and
atomic output folders.

May import: the stdlib, numpy, safetensors, and torch only inside functions that need it (the
merge runs without torch); from this package only errors and model_shapes. Never the training stack.
"""
