"""Model flavors the ladder adds to torchtitan 0.2.2's llama3, through torchtitan's own extension point.

torchtitan's Trainer imports `experimental.custom_import` before it looks up `model.name`'s train
spec (torchtitan/train.py), and `register_train_spec` (torchtitan/protocols/train_spec.py) lets a
module add a spec under a new name. A job file that sets

    [experimental]
    custom_import = "llm_pipeline.training.torchtitan.flavors"
    [model]
    name = "llama3_ladder"
    flavor = "1B"

trains llama3's own model, parallelization, optimizer, data loader and state-dict adapter with
every llama3 flavor plus the ones below; no torchtitan file is changed. Importing this module
registers the spec (once per process).

`1B`: the shape of Llama 3.2 1B (hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, the Llama 3
vocabulary): about 1.5 billion parameters, as torchtitan's llama3 keeps the output projection
separate from the embedding. Its full training state (fp32 weights, AdamW moments, gradients) is
about 24 GB, so a rung fits one 80 GB GPU at sequence length 8192.
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec, llama3_args
from torchtitan.protocols import train_spec

MODEL_NAME = "llama3_ladder"
FLAVORS = {
    "1B": TransformerModelArgs(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5, multiple_of=256, rope_theta=500000
    ),
}


def register() -> None:
    try:
        train_spec.get_train_spec(MODEL_NAME)
    except ValueError:  # not registered yet in this process
        spec = dataclasses.replace(get_train_spec(), model_args={**llama3_args, **FLAVORS})
        train_spec.register_train_spec(MODEL_NAME, spec)


register()
