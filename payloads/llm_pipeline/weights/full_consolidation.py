"""Turn a full-model tensor-parallel checkpoint into a Hugging Face model folder, streaming.

The output layout (shards, headers, index) is planned from names and shapes alone; then one decoder
layer at a time is read from every TP rank file (lazily: xser tensor files one by one, plain files
memory-mapped only while copied), rebuilt in HF form (full_layout) and written in place
(safetensors_writer). Memory holds about one layer, whatever the model size. The folder gets the
checkpoint's config and generation config (dtype recorded) and the tokenizer (from the checkpoint,
else from the base model), and is checked against the base model's tensor names and shapes.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.full_checkpoint import FullCheckpoint
from llm_pipeline.weights.full_layout import RankShapes, Unit, hf_order, plan_stage
from llm_pipeline.weights.model_files import CONFIG_NAME, TOKENIZER_FILES, open_model_folder
from llm_pipeline.weights.safetensors_writer import ShardedWriter, plan_shards
from llm_pipeline.weights.xser_reader import LazyRankFile

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
TIED_HEAD = "lm_head.weight"
READ_THREADS = 8  # one per TP rank file of a trn1 TP=8 layout: reads are I/O, the GIL is released


@dataclass
class Stage:
    ranks: list[LazyRankFile]
    units: list[Unit]


def open_stage(metadata_file: Path, rank_files: list[Path], tp: int) -> Stage:
    try:
        metadata = json.loads(metadata_file.read_text())
        metadata["parameters"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{metadata_file} is not valid neuronx-distributed metadata ({exc})") from None
    ranks = [LazyRankFile(path) for path in rank_files]
    for rank in ranks[1:]:
        if rank.shapes != ranks[0].shapes:
            extra = sorted(set(rank.shapes) ^ set(ranks[0].shapes)) or [
                n for n in rank.shapes if rank.shapes[n] != ranks[0].shapes[n]
            ]
            raise CheckpointError(f"{rank.path.name} and {ranks[0].path.name} differ (e.g. {extra[0]})")
    shapes = RankShapes(shapes=ranks[0].shapes, dtypes=ranks[0].dtypes)
    return Stage(ranks=ranks, units=plan_stage(metadata, shapes, tp, str(metadata_file)))


def batches(stages: list[Stage]) -> Iterator[tuple[Stage, list[Unit]]]:
    """Units of one decoder layer (or the embeddings, or the head) at a time, in HF order."""
    tagged = [(unit, stage) for stage in stages for unit in stage.units]
    order = {id(unit): i for i, unit in enumerate(hf_order([unit for unit, _ in tagged]))}
    tagged.sort(key=lambda pair: order[id(pair[0])])
    current: list[Unit] = []
    owner: Stage | None = None
    for unit, stage in tagged:
        if current and (stage is not owner or unit.layer != current[0].layer):
            yield owner, current
            current = []
        owner = stage
        current.append(unit)
    if current:
        yield owner, current


def read_config(checkpoint: Path, base: Path | None) -> tuple[dict, Path]:
    for folder in (checkpoint, base):
        if folder is not None and (folder / CONFIG_NAME).is_file():
            try:
                return json.loads((folder / CONFIG_NAME).read_text()), folder
            except ValueError as exc:
                raise CheckpointError(f"{folder / CONFIG_NAME} is not valid JSON ({exc})") from None
    raise CheckpointError(f"{checkpoint} has no {CONFIG_NAME} and no base model folder was given to take it from")


def copy_side_files(checkpoint: Path, base: Path | None, output: Path, config: dict, dtype: torch.dtype) -> None:
    """Config (dtype recorded), generation config and tokenizer files, from the checkpoint first."""
    dtype_name = str(dtype).removeprefix("torch.")
    for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]:
        config[key] = dtype_name
    (output / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer_source = next(
        (f for f in (checkpoint, base) if f is not None and any((f / n).is_file() for n in TOKENIZER_FILES)), None
    )
    if tokenizer_source is None:
        print(f"note: no tokenizer in {checkpoint} or the base model; the model folder has none", flush=True)
    for name in (GENERATION_CONFIG, *TOKENIZER_FILES, *TOKENIZER_EXTRAS):
        source = next((f / name for f in (checkpoint, base) if f is not None and (f / name).is_file()), None)
        if name != GENERATION_CONFIG and tokenizer_source is not None:
            source = tokenizer_source / name if (tokenizer_source / name).is_file() else None
        if source is not None:
            shutil.copy2(source, output / name)


def check_against_base(written: dict[str, tuple[int, ...]], base: Path) -> None:
    """The rebuilt model must have the base model's tensor names and shapes (dtypes may differ);
    checked on the plan, before anything is read or written."""
    expected = {name: slot.shape for name, slot in open_model_folder(base).tensors.items()}
    missing, extra = sorted(set(expected) - set(written)), sorted(set(written) - set(expected))
    if missing or extra:
        detail = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise CheckpointError(
            f"the consolidated model does not match the base model {base}: {len(missing)} missing, "
            f"{len(extra)} unexpected tensors ({detail})"
        )
    for name, shape in written.items():
        if tuple(expected[name]) != tuple(shape):
            raise CheckpointError(
                f"the consolidated model does not match the base model {base}: {name} is {list(shape)} "
                f"here and {list(expected[name])} there"
            )


def consolidate_full(checkpoint: FullCheckpoint, output: Path, *, base: Path | None = None) -> dict:
    """Write the HF model folder of ``checkpoint`` into ``output`` (an empty folder); returns a summary."""
    stages = [
        open_stage(meta, files, checkpoint.tp_size)
        for meta, files in zip(checkpoint.metadata_files, checkpoint.rank_files, strict=True)
    ]
    config, _ = read_config(checkpoint.folder, base)
    work = list(batches(stages))
    outputs = [out for _, units in work for unit in units for out in unit.outputs]
    names = Counter(out.name for out in outputs)
    twice = [name for name, count in names.items() if count > 1]
    if twice:
        raise CheckpointError(f"{twice[0]} is held by more than one pipeline stage")
    if config.get("tie_word_embeddings") and TIED_HEAD in names:
        outputs = [out for out in outputs if out.name != TIED_HEAD]  # tied: HF rebuilds it from embed_tokens
    float_dtypes = Counter(out.dtype for out in outputs if out.dtype.is_floating_point)
    dtype = float_dtypes.most_common(1)[0][0] if float_dtypes else torch.float32
    total = sum(out.nbytes for out in outputs)
    if base is not None and base.is_dir():
        check_against_base({out.name: out.shape for out in outputs}, base)
    plans = plan_shards(outputs)
    print(
        f"consolidating {len(outputs)} tensors ({total / 1e9:.2f} GB, {dtype}) from TP={checkpoint.tp_size} "
        f"x PP={len(stages)} rank files into {len(plans)} shard(s)",
        flush=True,
    )
    writer = ShardedWriter(output, plans)
    count, done, started, last = 0, 0, time.monotonic(), time.monotonic()
    # The next layer is read (every rank file at once) while this one is rebuilt and written: the
    # disk sees reads queued in parallel and the writes never wait for them.
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:

        def read(batch: int) -> list[Future]:
            stage, units = work[batch]
            sources = sorted({s for unit in units for s in unit.sources})
            return [pool.submit(rank.load, sources) for rank in stage.ranks]

        try:
            pending = read(0) if work else []
            for batch, (_, units) in enumerate(work):
                loaded = [future.result() for future in pending]
                pending = read(batch + 1) if batch + 1 < len(work) else []
                pieces = {name: [tensors[name] for tensors in loaded] for name in loaded[0]}
                del loaded
                for unit in units:
                    for name, blocks in unit.rebuild(pieces).items():
                        if writer.wants(name):
                            done += writer.write(name, blocks)
                            count += 1
                del pieces
                if time.monotonic() - last >= 5:
                    last = time.monotonic()
                    print(f"  {done / 1e9:.2f}/{total / 1e9:.2f} GB written", flush=True)
            writer.close()
        except BaseException:
            for future in pending:
                future.cancel()
            writer.abort()
            raise
    copy_side_files(checkpoint.folder, base, output, config, dtype)
    seconds = time.monotonic() - started
    return {"tensors": count, "bytes": done, "shards": len(plans), "seconds": round(seconds, 2)}
