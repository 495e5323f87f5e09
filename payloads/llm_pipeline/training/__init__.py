"""Training: one subpackage per engine, and what every engine shares beside them.

- ``neuron/``: optimum-neuron on Trainium (LoRA and full fine-tuning).
- ``torch/``: transformers + trl + peft + accelerate on CPU or CUDA (LoRA, DoRA, QLoRA, full).
- ``torchtitan/``: the torchtitan pretraining ladder, its metrics, report and HF export.
- Shared here: the run plan (plan), metrics logging, token counting and checkpoint seals
  (callbacks), MFU (metrics), the fixed-length collator, the data step's padding report
  (data_stats), block mode for full fine-tuning on a corpus (text_blocks), LoRA and full-model
  parameter counts (full_rules; LoRA's is the top-level model_shapes).

May import (the shared modules here): the stdlib, the training stack of the image (torch,
transformers, trl, peft, datasets, accelerate), the top-level config, errors, prompt and
model_shapes modules, jobs.prom_textfile (stdlib only: the run's figures for node exporter), and
weights.checkpoints (the checkpoint seals the callbacks write). Never
an engine subpackage: engines import the shared room, not the reverse. Engines are imported only
by the step modules (train, prepare, pretrain) and by run_metrics (torchtitan's stdlib metric-line
parser, for compare and evaluate), so other steps never load a training stack, and no engine
imports another engine's modules.
"""
