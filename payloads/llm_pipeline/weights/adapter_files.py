"""A peft LoRA adapter folder: its config, its tensors, and what each tensor updates.

peft saves ``adapter_config.json`` and ``adapter_model.safetensors`` with keys such as
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (linear layers),
``...embed_tokens.lora_embedding_A`` (embeddings) and, when an embedding layer is targeted,
``...embed_tokens.base_layer.weight`` (a full copy of the base weight that loading puts back).
A DoRA adapter (``use_dora``) adds ``...q_proj.lora_magnitude_vector``, one magnitude per output row.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.safetensors_header import TensorSlot, read_header

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."
# Adapter features a plain W + scale * B @ A merge cannot express; refused with a clear message.
UNSUPPORTED_OPTIONS = {
    "lora_bias": "LoRA bias",
    "fan_in_fan_out": "fan_in_fan_out",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "modules_to_save": "modules_to_save",
    "trainable_token_indices": "trainable tokens",
    "layer_replication": "layer replication",
}
_SUFFIXES = {
    ".lora_A.weight": ("linear", "A"),
    ".lora_B.weight": ("linear", "B"),
    ".lora_embedding_A": ("embedding", "A"),
    ".lora_embedding_B": ("embedding", "B"),
    ".base_layer.weight": (None, "base"),
    ".lora_magnitude_vector": ("linear", "magnitude"),
}


@dataclass(frozen=True)
class LoraUpdate:
    """One base tensor's update: W' = W + scale * B @ A (embeddings: + scale * (B @ A).T).

    DoRA: W' = m * V / ||V|| with V = W + scale * B @ A and the norm taken per output row.
    """

    module: str  # e.g. model.layers.0.self_attn.q_proj
    kind: str  # "linear" or "embedding"
    a_key: str
    b_key: str
    base_copy_key: str | None  # adapter key holding a full base weight that replaces W first
    magnitude_key: str | None = None  # DoRA's per-row magnitude m

    @property
    def target(self) -> str:
        return f"{self.module}.weight"


@dataclass(frozen=True)
class AdapterFolder:
    path: Path
    config: dict
    updates: dict[str, LoraUpdate]  # by target tensor name
    tensors: dict[str, TensorSlot]  # the weights file's header entries (shapes, dtypes)

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_NAME

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    @property
    def scale(self) -> float:
        r, alpha = self.config["r"], self.config["lora_alpha"]
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r


def read_adapter_config(path: Path) -> dict:
    config_file = Path(path) / CONFIG_NAME
    if not config_file.is_file():
        raise CheckpointError(f"{config_file} is missing: not a peft adapter folder")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_file} is not valid JSON ({exc})") from None
    if config.get("peft_type") != "LORA":
        raise CheckpointError(
            f"{config_file}: peft_type is {config.get('peft_type')!r}; only LoRA adapters are supported"
        )
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or isinstance(config.get(key), bool) or config[key] <= 0:
            raise CheckpointError(f"{config_file}: {key} must be a positive number, got {config.get(key)!r}")
    for key, feature in UNSUPPORTED_OPTIONS.items():
        if config.get(key):
            raise CheckpointError(f"{config_file}: {feature} ({key}={config[key]!r}) is not supported by this merge")
    return config


def open_adapter_folder(path: Path) -> AdapterFolder:
    """Read and check an adapter folder; no tensor data is loaded here."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"adapter folder {path} does not exist; run the consolidate step or pass --adapter")
    config = read_adapter_config(path)
    if not (path / WEIGHTS_NAME).is_file():
        raise CheckpointError(f"{path / WEIGHTS_NAME} is missing; run the consolidate step first")
    header = read_header(path / WEIGHTS_NAME)
    updates = plan_updates(header.tensors, source=path / WEIGHTS_NAME)
    rank = int(config["r"])
    dora = bool(config.get("use_dora"))
    for update in updates.values():
        if dora != (update.magnitude_key is not None):
            state = "has no lora_magnitude_vector" if dora else "has a DoRA magnitude but use_dora is false"
            raise CheckpointError(f"{path / WEIGHTS_NAME}: {update.module} {state}; the adapter is inconsistent")
        a_rank, b_rank = header.tensors[update.a_key].shape[0], header.tensors[update.b_key].shape[-1]
        if a_rank != rank or b_rank != rank:
            raise CheckpointError(
                f"{path / WEIGHTS_NAME}: {update.module} has rank {a_rank}/{b_rank} "
                f"but adapter_config.json says r={rank}"
            )
    return AdapterFolder(path=path, config=config, updates=updates, tensors=header.tensors)


def plan_updates(shapes: dict[str, object], *, source: Path) -> dict[str, LoraUpdate]:
    """Group adapter keys by module; every key must belong to exactly one complete update."""
    parts: dict[str, dict[str, str]] = {}
    kinds: dict[str, str] = {}
    for key in shapes:
        if not key.startswith(KEY_PREFIX):
            raise CheckpointError(
                f"{source}: tensor {key!r} does not start with {KEY_PREFIX!r}: not a peft causal-LM adapter"
            )
        suffix = next((suffix for suffix in _SUFFIXES if key.endswith(suffix)), None)
        if suffix is None:
            raise CheckpointError(f"{source}: tensor {key!r} is not a LoRA weight this merge understands")
        kind, role = _SUFFIXES[suffix]
        module = key[len(KEY_PREFIX) : -len(suffix)]
        if role in parts.setdefault(module, {}):
            raise CheckpointError(f"{source}: module {module} has two {role} tensors")
        parts[module][role] = key
        if kind is not None and kinds.setdefault(module, kind) != kind:
            raise CheckpointError(f"{source}: module {module} mixes linear and embedding LoRA tensors")
    updates = {}
    for module, roles in sorted(parts.items()):
        if "A" not in roles or "B" not in roles:
            missing = "A" if "A" not in roles else "B"
            raise CheckpointError(
                f"{source}: module {module} has no LoRA {missing} tensor; the adapter file is incomplete"
            )
        update = LoraUpdate(module, kinds[module], roles["A"], roles["B"], roles.get("base"), roles.get("magnitude"))
        updates[update.target] = update
    return updates
