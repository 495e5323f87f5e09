"""The shapes a LoRA adapter must have on its base model, from the model's config.json.

A consolidated adapter whose factors do not fit the model config was rebuilt from a checkpoint of
another model, or with a wrong tensor-parallel layout; either way it must not reach the merge.
Each adapted module (in -> out) has A [r, in] and B [out, r]; embeddings are vocab -> hidden.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_pipeline.errors import CheckpointError
from llm_pipeline.model_shapes import module_dims
from llm_pipeline.weights.adapter_files import AdapterFolder

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def check_adapter_shapes(
    adapter: AdapterFolder, model_config: Mapping[str, Any], config_file: Path, *, label: str
) -> None:
    """Every factor's shape and every layer index must fit the model config; errors start with ``label``."""
    dims, layers, r = module_dims(model_config), model_config.get("num_hidden_layers"), adapter.rank
    for update in adapter.updates.values():
        name = update.module.rsplit(".", 1)[-1]
        if name not in dims:
            raise CheckpointError(f"{label}: {update.module} is not a module of a Llama-shaped model")
        layer = _LAYER.search(f".{update.module}.")
        if layer and layers is not None and int(layer[1]) >= layers:
            raise CheckpointError(
                f"{label}: {update.module} is beyond the {layers} layers of {config_file}: "
                "the checkpoint was trained from another model than paths.model_dir"
            )
        fan_in, fan_out = dims[name]
        for key, expected in ((update.a_key, [r, fan_in]), (update.b_key, [fan_out, r])):
            actual = list(adapter.tensors[key].shape)
            if actual != expected:
                raise CheckpointError(
                    f"{label}: {key} is {actual} after consolidation, but {config_file} implies "
                    f"{expected} ({name}: {fan_in} -> {fan_out}, r={r}): the checkpoint was trained from another "
                    "model than paths.model_dir, or its tensor-parallel layout was not read as written"
                )
