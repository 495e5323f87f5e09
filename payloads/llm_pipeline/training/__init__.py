"""Training glue shared by every engine, and one module per engine.

May import: the stdlib, the training stack of the image (torch, transformers, trl, peft, datasets,
accelerate; optimum-neuron on Trainium), and the top-level config, errors, prompt and model_shapes
modules.
Engines are imported only by the train step, so other steps never load a training stack.
"""
