"""Merge a LoRA or DoRA adapter into its base model, streaming tensor by tensor.

A QLoRA adapter merges, by merge.qlora_base, into the weights training computed with (dequantized:
every weight the 4-bit model held goes through NF4 and back with the run's settings first, as
training's load did) or into the bf16 base folder as it is (bf16); train.method full has no adapter,
so the step says so and does nothing.

    python -m llm_pipeline.merge --config run.toml [--base DIR] [--adapter DIR] [--output DIR]

Defaults: paths.model_dir + paths.adapter_dir -> paths.merged_dir. Every adapter module is checked
against the base model (name, shape, dtype) before anything is written; the output keeps the base
model's shards and index, with config, generation config and tokenizer files copied, so it loads
with ``AutoModelForCausalLM.from_pretrained`` and no Hub access. The result appears under the
output path only when complete (see atomic_output).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections import Counter
from pathlib import Path

from llm_pipeline import cli, run_inputs, run_state
from llm_pipeline.config import QLORA_MERGE_BASES, LoraConfig, RunConfig
from llm_pipeline.errors import CheckpointError
from llm_pipeline.run_files import TrainedFrom
from llm_pipeline.weights.adapter_files import AdapterFolder, open_adapter_folder
from llm_pipeline.weights.atomic_output import AtomicOutputDir
from llm_pipeline.weights.merge_stream import BaseRounding, LoraFactors, ProgressPrinter, merge_shard
from llm_pipeline.weights.model_files import ModelFolder, open_model_folder
from llm_pipeline.weights.safetensors_header import FLOAT_DTYPES


def check_fits(model: ModelFolder, adapter: AdapterFolder) -> None:
    """Every update must name a float base tensor whose shape matches its factors."""
    base_tensors = model.tensors
    for target, update in adapter.updates.items():
        slot = base_tensors.get(target)
        if slot is None:
            hint = ""
            if update.module.endswith("lm_head") and "model.embed_tokens.weight" in base_tensors:
                hint = " (this model ties lm_head to embed_tokens, so lm_head has no weight of its own)"
            raise CheckpointError(
                f"adapter module {update.module} has no base tensor {target} in {model.path}{hint}: "
                "the adapter was trained for another model architecture"
            )
        if slot.dtype not in FLOAT_DTYPES or len(slot.shape) != 2:
            raise CheckpointError(
                f"base tensor {target} is {slot.dtype} {list(slot.shape)}: only 2-D float weights can be merged"
            )
        a, b = adapter.tensors[update.a_key].shape, adapter.tensors[update.b_key].shape
        rows, cols = (a[1], b[0]) if update.kind == "embedding" else (b[0], a[1])
        copy_ok = update.base_copy_key is None or adapter.tensors[update.base_copy_key].shape == slot.shape
        magnitude_ok = update.magnitude_key is None or adapter.tensors[update.magnitude_key].shape == (rows,)
        if (rows, cols) != slot.shape or not copy_ok or not magnitude_ok:
            raise CheckpointError(
                f"adapter module {update.module} does not fit the base model: LoRA A {list(a)} and B {list(b)} "
                f"imply a {rows}x{cols} weight, but {target} in {model.path} is {slot.shape[0]}x{slot.shape[1]}; "
                "the adapter was trained for another model (check --base)"
            )


def same_model(named: str, base: Path) -> bool:
    """Whether an adapter's base_model_name_or_path names the base folder: the same folder, or the same
    model name (the Hub id's last part or the folder name, as the download step names folders)."""
    if Path(named).exists() and Path(named).resolve() == base.resolve():
        return True
    names = {base.resolve().name}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        names.add(
            str(json.loads((base / "config.json").read_text()).get("_name_or_path", "")).rstrip("/").split("/")[-1]
        )
    return named.rstrip("/").split("/")[-1] in names - {""}


def check_base_model(adapter: AdapterFolder, base: Path, *, allow_other: bool) -> None:
    """Refuse an adapter trained on another model (same shapes do not make it the same model)."""
    named = adapter.config.get("base_model_name_or_path")
    if not named or same_model(str(named), base):
        return
    message = (
        f"the adapter {adapter.path} was trained on {named!r} (base_model_name_or_path in adapter_config.json), "
        f"but the base folder is {base}"
    )
    if allow_other:
        print(f"warning: {message}; merging anyway (--allow-other-base)", flush=True)
        return
    raise CheckpointError(
        f"{message}: merging into another model gives a wrong model; pass that model as --base (or set "
        "paths.model_dir), or add --allow-other-base when this folder holds the same weights under another name"
    )


def check_paths(output: Path, *inputs: Path) -> None:
    out = output.resolve()
    for path in inputs:
        src = path.resolve()
        if out == src or src.is_relative_to(out):
            raise CheckpointError(f"output {output} would overwrite the input {path}; choose another --output")


def write_merged(
    model: ModelFolder, adapter: AdapterFolder, folder: Path, rounding: BaseRounding | None = None
) -> Counter[str]:
    """Write every merged shard, the index and the other files into ``folder``; verify every update applied once."""
    used: Counter[str] = Counter()
    with contextlib.closing(LoraFactors(adapter)) as lora:
        for number, shard in enumerate(model.shards, 1):
            started = time.monotonic()
            updates = {name: adapter.updates[name] for name in shard.tensors if name in adapter.updates}
            label = f"[{number}/{len(model.shards)}] {shard.path.name}"
            progress = ProgressPrinter(label, shard.size)
            used.update(merge_shard(shard, folder / shard.path.name, lora, updates, progress, rounding))
            seconds = max(time.monotonic() - started, 1e-6)
            rate = shard.size / 1e6 / seconds
            print(
                f"{label}: {shard.size / 1e9:.2f} GB, {len(updates)} tensor(s) merged, "
                f"{seconds:.1f} s ({rate:.0f} MB/s)",
                flush=True,
            )
    unmerged = sorted(set(adapter.updates) - set(used))
    repeated = sorted(name for name, count in used.items() if count != 1)
    if unmerged or repeated:
        raise CheckpointError(
            f"merge verification failed: unmerged {unmerged[:3]}, merged more than once {repeated[:3]}"
        )
    for path in [*model.extra_files, *([model.index_file] if model.index_file else [])]:
        shutil.copy2(path, folder / path.name)
    return used


def merge(
    base: Path,
    adapter_dir: Path,
    output: Path,
    *,
    overwrite: bool = False,
    allow_other_base: bool = False,
    run_lora: LoraConfig | None = None,
    rounding: BaseRounding | None = None,
) -> Path:
    """Merge ``adapter_dir`` into ``base`` at ``output``; ``run_lora`` (the run config's [lora]) only
    adds a note when the adapter was trained with other settings (the adapter's own config wins);
    ``rounding`` replaces those base weights first (a QLoRA adapter's dequantized 4-bit base)."""
    model = open_model_folder(base)
    adapter = open_adapter_folder(adapter_dir)
    if run_lora is not None:
        note_if_settings_differ(run_lora, adapter)
    check_base_model(adapter, base, allow_other=allow_other_base)
    check_fits(model, adapter)
    if rounding is not None:
        check_rounded(model, rounding)
    check_paths(output, base, adapter_dir)
    atomic = AtomicOutputDir(output, overwrite=overwrite)
    atomic.check()
    print(
        f"merge: base {base} ({len(model.shards)} shard(s), {model.total_bytes / 1e9:.2f} GB); adapter {adapter_dir} "
        f"({len(adapter.updates)} {'DoRA' if adapter.config.get('use_dora') else 'LoRA'} modules, r={adapter.rank}, "
        f"alpha={adapter.config['lora_alpha']}, "
        f"rslora={bool(adapter.config.get('use_rslora'))}, scale={adapter.scale:g})",
        flush=True,
    )
    if not model.has_tokenizer:
        print(f"warning: {base} has no tokenizer files; the merged model will need one from elsewhere", flush=True)
    started = time.monotonic()
    if rounding is not None:
        print(f"merge: {len(rounding.names)} base weight(s) quantized to 4-bit and dequantized first", flush=True)
    used = atomic.write("merge", lambda partial: write_merged(model, adapter, partial, rounding))
    print(
        f"merged model written to {output}: {len(used)} of {len(adapter.updates)} LoRA modules applied once, "
        f"{len(model.extra_files)} config/tokenizer file(s) copied, {time.monotonic() - started:.1f} s",
        flush=True,
    )
    return output


def note_if_settings_differ(run_lora: LoraConfig, adapter: AdapterFolder) -> None:
    ours = (run_lora.r, run_lora.alpha, run_lora.use_rslora)
    theirs = (adapter.rank, adapter.config["lora_alpha"], bool(adapter.config.get("use_rslora")))
    if ours != theirs:
        print(
            f"note: the run config says r/alpha/rslora={ours}, the adapter says {theirs}; using the adapter's",
            flush=True,
        )


def build_parser():
    parser = cli.parser("merge", __doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="base model folder (default: paths.model_dir)")
    parser.add_argument("--adapter", type=Path, help="peft adapter folder (default: paths.adapter_dir)")
    parser.add_argument("--output", type=Path, help="merged model folder (default: paths.merged_dir)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    parser.add_argument(
        "--allow-other-base",
        action="store_true",
        help="merge even when the adapter's base_model_name_or_path names another model than --base",
    )
    parser.add_argument(
        "--qlora-base",
        choices=QLORA_MERGE_BASES,
        help="train.method qlora: the base the adapter is added to (default: merge.qlora_base)",
    )
    return parser


def run(cfg, args) -> None:
    if cfg.train.method == "full" and args.adapter is None:
        print(
            f"merge: nothing to merge for train.method full; consolidate wrote the model to {cfg.paths.merged_dir}",
            flush=True,
        )
        return
    if args.adapter is None:  # the run's own adapter: consolidate made it from the finished checkpoint, if any,
        # trained with this config and, unless --base names another, on the weights it is added to (run_state)
        learned = cfg.learned()
        now = run_inputs.trained_from(cfg, learned, run_inputs.MODEL_INPUTS) if args.base is None else None
        run_state.shipped_checkpoint(cfg.paths.checkpoints_dir, now or TrainedFrom(learned), "merge")
    merge(
        args.base or Path(cfg.paths.model_dir),
        args.adapter or cfg.paths.adapter_dir,
        args.output or cfg.paths.merged_dir,
        overwrite=args.overwrite,
        allow_other_base=args.allow_other_base,
        run_lora=cfg.lora,
        rounding=qlora_rounding(cfg, args.base or Path(cfg.paths.model_dir), args.qlora_base or cfg.merge.qlora_base),
    )


def qlora_rounding(cfg: RunConfig, base: Path, qlora_base: str) -> BaseRounding | None:
    """The dequantized 4-bit base of a qlora run (None otherwise): the run's BitsAndBytesConfig and load dtype."""
    if cfg.train.method != "qlora" or qlora_base != "dequantized":
        return None
    from llm_pipeline.qlora_base import RoundTrip, quantized_weights
    from llm_pipeline.training.parts import model_part
    from llm_pipeline.training.torch.methods import load_dtype, quantization_config

    part = model_part(cfg)
    quantization = quantization_config(part)
    return BaseRounding(quantized_weights(base, quantization), RoundTrip(quantization, load_dtype(part)))


def check_rounded(model: ModelFolder, rounding: BaseRounding) -> None:
    """Every weight the 4-bit model holds must be a 2-D float tensor of the base folder."""
    for name in sorted(rounding.names):
        slot = model.tensors.get(name)
        if slot is None or slot.dtype not in FLOAT_DTYPES or len(slot.shape) != 2:
            raise CheckpointError(
                f"the 4-bit model of {model.path} holds {name}, which the folder has not as a 2-D float tensor "
                f"({'missing' if slot is None else f'{slot.dtype} {list(slot.shape)}'}); merge with --qlora-base bf16"
            )


def main(argv: list[str] | None = None) -> int:
    return cli.run_step(build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
