"""Export a torchtitan DCP checkpoint to a Hugging Face folder, with torchtitan 0.2.2's own parts.

0.2.2 ships the conversion as scripts/checkpoint_conversion/convert_to_hf.py, outside its wheel;
this step does the same through the library it is built on: the model's train spec (model class,
flavor arguments, state-dict adapter), torchtitan's ModelWrapper for the state-dict keys its
checkpointer writes, torch.distributed.checkpoint to load, the adapter's to_hf, and torch's
HuggingFaceStorageWriter for consolidated safetensors (its per-rank shards are removed once
consolidated). The generation config and tokenizer files come from model.hf_assets_path (the
download step put them there); config.json is that folder's, with every shape field set from the
flavor the checkpoint was trained with (a custom flavor differs from the tokenizer's model), and
each field changed is printed. The folder is written next to its final place and renamed when
complete.

Checkpoints of the float8 rungs with the FSDP float8 all-gather hold torchao's
WeightWithDynamicFloat8CastTensor: torch.load (weights_only) refuses that class until
torchao.float8 is imported, which registers it as a safe global, so the export imports it first
whenever the rung's job used the float8 converter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.run_files import TITAN_STEP
from llm_pipeline.training.torchtitan import ladder

COPIED_ASSETS = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",  # transformers >= 4.5x saves the chat template beside tokenizer_config.json
)


def newest_checkpoint(folder: Path) -> Path:
    """The step-N folder with the highest N that holds a complete DCP checkpoint (.metadata)."""
    steps = [(step, path) for step, path in TITAN_STEP.folders(folder) if (path / ".metadata").is_file()]
    if not steps:
        raise StepError(f"no complete torchtitan checkpoint (step-N/.metadata) in {folder}: did the rung finish?")
    return max(steps)[1]


def export(cfg: RunConfig, rung: str, out_dir: Path) -> Path:
    job_file = ladder.rung_dir(cfg, rung) / "job.toml"
    job = ladder.read_toml(job_file, f"rung {rung}'s job file")
    model, checkpoint = job.get("model", {}), job.get("checkpoint", {})
    dump = Path(job.get("job", {}).get("dump_folder", str(job_file.parent)))
    source = newest_checkpoint(dump / checkpoint.get("folder", "checkpoint"))
    ladder.import_custom_module(job)
    assets = Path(model.get("hf_assets_path", cfg.paths.model_dir))
    print(
        f"exporting {source} ({model.get('name')} {model.get('flavor')}) to a Hugging Face folder {out_dir}", flush=True
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    config = convert(
        source,
        tmp,
        model_name=model.get("name", "llama3"),
        flavor=model.get("flavor", "8B"),
        assets=assets,
        dtype=checkpoint.get("export_dtype", "bfloat16"),
        float8=ladder.FLOAT8_CONVERTER in model.get("converters", []),
    )
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED_ASSETS:
        if (assets / name).is_file():
            shutil.copy2(assets / name, tmp / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    print(f"Hugging Face folder ready: {out_dir}", flush=True)
    return out_dir


def flavor_config(args, model, base: dict, dtype: str) -> dict:
    """Hugging Face's LlamaConfig fields for torchtitan llama3 flavor `args` (model: built from it),
    over `base` (the assets' config.json); prints each field the flavor changes."""
    scaling = args.rope_scaling_args
    shape = {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "intermediate_size": model.layers["0"].feed_forward.w1.weight.shape[0],
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        # torchtitan's llama3 always applies Llama 3.1's frequency scaling (precompute_freqs_cis)
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": scaling.scaling_factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    }
    for key, value in shape.items():
        if key in base and base[key] != value:
            print(f"config.json: {key} {base[key]!r} -> {value!r} (the checkpoint's flavor)", flush=True)
    defaults = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    return {**defaults, "max_position_embeddings": args.max_seq_len, **base, **shape, "torch_dtype": dtype}


def convert(
    source: Path, target: Path, *, model_name: str, flavor: str, assets: Path, dtype: str, float8: bool = False
) -> dict:
    """DCP checkpoint `source` -> consolidated safetensors in `target`, on CPU, in `dtype`; returns
    the config.json for it."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torchtitan.protocols.train_spec as train_spec
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torchtitan.components.checkpoint import ModelWrapper
    from torchtitan.config import TORCH_DTYPE_MAP

    spec = train_spec.get_train_spec(model_name)
    if flavor not in spec.model_args:
        raise StepError(f"model.flavor {flavor!r} is not a {model_name} flavor ({', '.join(spec.model_args)})")
    if dtype not in TORCH_DTYPE_MAP:
        raise StepError(f"checkpoint.export_dtype {dtype!r} is not one of {', '.join(TORCH_DTYPE_MAP)}")
    if float8:
        try:
            import torchao.float8  # noqa: F401  (registers its weight classes with torch.load)
        except ImportError:
            raise StepError(
                f"{source} was saved by a float8 rung and torchao is not importable here: run the export in the "
                "training image (it pins torchao), or install the torchao version the rung trained with"
            ) from None
    args = spec.model_args[flavor]
    with torch.device("cpu"):
        model = spec.model_cls(args)
    state = ModelWrapper(model)._get_state_dict()
    dcp.load(state, checkpoint_id=str(source))
    adapter = spec.state_dict_adapter(args, str(assets) if assets.is_dir() else None)
    hf_state = {key: value.to(TORCH_DTYPE_MAP[dtype]) for key, value in adapter.to_hf(state).items()}
    writer = HuggingFaceStorageWriter(
        path=str(target),
        save_distributed=True,
        fqn_to_index_mapping=adapter.fqn_to_index_mapping,
        enable_consolidation=True,
        thread_count_consolidation=5,
    )
    with torch.inference_mode():
        dcp.save(hf_state, storage_writer=writer)
    shutil.rmtree(target / "sharded", ignore_errors=True)  # the per-rank copy, now consolidated
    base = assets / "config.json"
    return flavor_config(args, model, json.loads(base.read_text()) if base.is_file() else {}, dtype)
