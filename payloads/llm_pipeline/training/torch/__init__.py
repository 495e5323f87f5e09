"""The torch engine: transformers + trl SFTTrainer + peft + accelerate (FSDP2/DDP), bitsandbytes and
liger-kernel, on CPU or CUDA.

May import: the stdlib, the CUDA image's training stack (torch, transformers, trl, peft, accelerate,
bitsandbytes, liger-kernel), the top-level config, errors, prompt and model_shapes modules and the
shared training modules (llm_pipeline.training.*). Never the neuron or torchtitan engine.
"""
