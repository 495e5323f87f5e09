"""The neuron engine: optimum-neuron 0.4.5 on Trainium (the only code that touches optimum-neuron).

May import: the stdlib, the Neuron image's training stack (optimum-neuron; torch_xla, whose
rendezvous is the barrier optimum-neuron's checkpoint save uses; transformers, trl, peft), the
top-level config, errors, prompt and model_shapes modules, the shared training modules
(llm_pipeline.training.*) and, for resume, the weights package and the consolidate step's functions.
Never the torch or torchtitan engine.
"""
