"""The torchtitan engine: the pretraining ladder's job files, dataset staging, metrics parsing, report
and HF export.

May import: the stdlib, torchtitan and torchao (inside functions: the ladder's planning and report
run without them), datasets and huggingface_hub (the dataset staging, inside functions), the
top-level config and errors modules and the shared training modules (llm_pipeline.training.*).
Never the neuron or torch engine.
"""
