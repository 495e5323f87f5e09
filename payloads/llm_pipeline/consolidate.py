"""Turn a training checkpoint into one peft adapter folder (lora, dora, qlora) or a model folder (full).

    python -m llm_pipeline.consolidate --config run.toml [--checkpoint DIR] [--output DIR]

Defaults: the finished checkpoint in paths.checkpoints_dir (run_state: refused when the run has not finished
or its newest complete checkpoint is another step) -> paths.adapter_dir. A sharded
neuronx-distributed adapter (neuron backend) is rebuilt into full tensors (weights/sharded_adapter); a plain
peft adapter (torch backend) is checked and copied, without importing torch. The output holds
``adapter_model.safetensors`` and ``adapter_config.json`` with Hugging Face module names, so
``PeftModel.from_pretrained`` loads it.
A full-model checkpoint (neuron backend, ``train.method = full``: ``checkpoint-N/shards/``) becomes a
Hugging Face model folder instead, by default in paths.merged_dir (weights/full_consolidation); so
does a torch backend full-model checkpoint (one process, DDP or FSDP2; weights/torch_checkpoint).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from llm_pipeline import cli, run_state
from llm_pipeline.errors import CheckpointError
from llm_pipeline.run_files import TrainedFrom
from llm_pipeline.weights.adapter_files import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    AdapterFolder,
    LoraUpdate,
    open_adapter_folder,
    read_adapter_config,
)
from llm_pipeline.weights.adapter_layout import PlainAdapter, ShardedAdapter, find_adapter
from llm_pipeline.weights.adapter_shapes import check_adapter_shapes
from llm_pipeline.weights.atomic_output import AtomicOutputDir
from llm_pipeline.weights.full_checkpoint import FullCheckpoint, find_full_checkpoint, find_torch_full_checkpoint
from llm_pipeline.weights.model_files import read_model_config

# optimum-neuron's fused modules, in case a config still names them: fused name -> HF names.
FUSED_TARGETS = {"gate_up_proj": ("gate_proj", "up_proj"), "qkv_proj": ("q_proj", "k_proj", "v_proj")}


def hf_adapter_config(config: dict) -> dict:
    """The adapter config for inference, with HF target module names."""
    config = dict(config, inference_mode=True)
    targets = config.get("target_modules")
    if isinstance(targets, list):
        names = []
        for target in targets:
            names.extend(FUSED_TARGETS.get(target, (target,)))
        config["target_modules"] = sorted(set(names))
    return config


def check_targets(config: dict, updates: Iterable[LoraUpdate], source: Path) -> None:
    """Every planned LoRA update belongs to a module the config targets."""
    targets = config.get("target_modules")
    if not isinstance(targets, list):
        return
    for update in updates:
        if not any(update.module == t or update.module.endswith("." + t) for t in targets):
            raise CheckpointError(f"{source}: weights for {update.module} but target_modules is {targets}")


def write_sharded(adapter: ShardedAdapter, output: Path) -> AdapterFolder:
    from llm_pipeline.weights import sharded_adapter  # torch: this branch alone reads tensors

    config = hf_adapter_config(read_adapter_config(adapter.folder))
    (output / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    sharded_adapter.write_tensors(adapter, output / WEIGHTS_NAME)
    written = open_adapter_folder(output)  # the result must read back as a mergeable adapter
    check_targets(config, written.updates.values(), adapter.folder / CONFIG_NAME)
    return written


def copy_plain(adapter: PlainAdapter, output: Path) -> AdapterFolder:
    checked = open_adapter_folder(adapter.folder)  # headers, key names and ranks are checked here
    config = hf_adapter_config(checked.config)
    check_targets(config, checked.updates.values(), checked.weights_file)
    shutil.copy2(adapter.folder / WEIGHTS_NAME, output / WEIGHTS_NAME)
    (output / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return checked  # the copy is byte for byte the file just checked


def consolidate_checkpoint(
    source: Path, output: Path, *, overwrite: bool = False, model_dir: Path | None = None
) -> Path:
    """Consolidate the adapter found at ``source`` (any accepted input) into ``output``.

    With ``model_dir``, every rebuilt shape is checked against the model's config.json.
    """
    model_config = read_model_config(model_dir) if model_dir is not None else None
    adapter = find_adapter(source)
    atomic = AtomicOutputDir(output, overwrite=overwrite)
    atomic.check()

    def build(partial: Path) -> AdapterFolder:
        if isinstance(adapter, PlainAdapter):
            print(f"consolidate: {adapter.folder} is a plain peft adapter; checking and copying it", flush=True)
            written = copy_plain(adapter, partial)
        else:
            print(
                f"consolidate: sharded adapter {adapter.folder} (TP={adapter.tp_size}, PP={len(adapter.rank_files)})",
                flush=True,
            )
            written = write_sharded(adapter, partial)
        if model_config is not None:
            config_file = Path(model_dir) / "config.json"
            check_adapter_shapes(written, model_config, config_file, label=f"the adapter rebuilt from {source}")
        return written

    written = atomic.write("consolidation", build)
    print(f"adapter written to {output}: {len(written.tensors)} tensors", flush=True)
    return output


def consolidate_full_checkpoint(
    checkpoint: FullCheckpoint, output: Path, *, overwrite: bool = False, base: Path | None = None
) -> Path:
    """Write the Hugging Face model folder of a full-model neuron checkpoint, atomically."""
    from llm_pipeline.weights.full_consolidation import consolidate_full  # torch: this branch alone reads tensors

    atomic = AtomicOutputDir(output, overwrite=overwrite)
    atomic.check()
    print(
        f"consolidate: full-model checkpoint {checkpoint.folder} (TP={checkpoint.tp_size}, "
        f"PP={len(checkpoint.rank_files)})",
        flush=True,
    )
    summary = atomic.write("consolidation", lambda partial: consolidate_full(checkpoint, partial, base=base))
    say_model_folder(output, summary)
    return output


def consolidate_torch_full(checkpoint: Path, base: Path, output: Path, dtype: str, *, overwrite: bool) -> Path:
    """Write the Hugging Face model folder of a torch backend full-model checkpoint, atomically."""
    from llm_pipeline.weights.torch_checkpoint import write_model_folder  # torch: this branch alone reads tensors

    atomic = AtomicOutputDir(output, overwrite=overwrite)
    atomic.check()
    print(f"consolidate: full-model checkpoint {checkpoint} -> {output} ({dtype})", flush=True)
    say_model_folder(
        output, atomic.write("consolidation", lambda partial: write_model_folder(checkpoint, base, partial, dtype))
    )
    return output


def say_model_folder(output: Path, summary: dict) -> None:
    took = f", {summary['seconds']:.1f} s" if "seconds" in summary else ""
    print(
        f"model folder written to {output}: {summary['tensors']} tensors, {summary['bytes'] / 1e9:.2f} GB "
        f"in {summary['shards']} shard(s){took}",
        flush=True,
    )


def build_parser():
    parser = cli.parser("consolidate", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="checkpoint, adapter, checkpoints or run folder (default: the finished one in paths.checkpoints_dir)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="folder to write (default: paths.adapter_dir; paths.merged_dir for a full-model checkpoint)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    return parser


def run(cfg, args) -> None:
    # the run's result is its finished checkpoint, never a newer or older one, nor one another config trained
    # (run_state: a raised train.max_steps trains first)
    source = args.checkpoint or run_state.shipped_checkpoint(
        cfg.paths.checkpoints_dir, TrainedFrom(cfg.learned()), "consolidate"
    )
    full = find_full_checkpoint(source)
    if full is not None:
        output = args.output or cfg.paths.merged_dir
        consolidate_full_checkpoint(full, output, overwrite=args.overwrite, base=Path(cfg.paths.model_dir))
        return
    torch_full = find_torch_full_checkpoint(source)
    if cfg.train.method == "full" and torch_full is not None:
        output = args.output or cfg.paths.merged_dir
        base = Path(cfg.paths.model_dir)
        consolidate_torch_full(torch_full, base, output, cfg.model.dtype, overwrite=args.overwrite)
        return
    consolidate_checkpoint(
        source,
        args.output or cfg.paths.adapter_dir,
        overwrite=args.overwrite,
        model_dir=Path(cfg.paths.model_dir),
    )


def main(argv: list[str] | None = None) -> int:
    return cli.run_step(build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
