"""Data step: dolly, chat-format (`messages`) or GRPO's prompt (`prompt`, `answer`) records from a Hub dataset, a
local JSON/JSONL/Parquet file or a folder -> validated, optionally split, saved in the run folder
(paths.data_dir) with a padding report.

Every training process then reads the same prepared copy: the Hub is hit once, the split is fixed
once, and a change of the [data] config, the seed, the tokenizer or a local dataset file is noticed
(run_files.DataSource, next to the copy) instead of silently training on stale data. The train step
run alone prepares missing or stale data through the same call (``prepare``); several processes refuse.
Formatting into prompt text happens in the trainer, per example (prompt.format_example). Block
mode (data.blocks, for full fine-tuning on a corpus) tokenizes here instead: see text_blocks.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from pathlib import Path

from llm_pipeline import cli
from llm_pipeline.config import (
    ANSWER_REWARDS,
    DATASET_FILE_FORMATS,
    DataConfig,
    GrpoConfig,
    RunConfig,
    dataset_looks_like_a_path,
)
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import (
    CHAT_ROLES,
    COLUMNS,
    GENERATION_MARKER,
    MESSAGES_COLUMN,
    PROMPT_COLUMN,
    REQUIRED_COLUMNS,
    format_prompt,
    is_chat,
)
from llm_pipeline.run_files import DATA_SOURCE_FILE, DATA_STATS_FILE, DataSource, DataStats
from llm_pipeline.training import data_stats, preference_data, text_blocks
from llm_pipeline.training.backends import resolve_backend
from llm_pipeline.training.plan import say
from llm_pipeline.training.rewards import ANSWER_COLUMN
from llm_pipeline.weights import model_files
from llm_pipeline.weights.atomic_output import AtomicOutputDir

# Other record layouts people bring, mapped onto the dolly columns: alpaca's instruction/input/output.
COLUMN_MAPS = {"alpaca": {"instruction": "instruction", "input": "context", "output": "response"}}
OPTIONAL_SOURCE_COLUMNS = {"input"}  # alpaca records without input have no context
TEXT_FILES = (".json", ".jsonl", ".csv")  # read as UTF-8 text: checked line by line first
# Refused above these shares of the records (counted and reported below them).
EMPTY_RESPONSES_REFUSED_ABOVE = 0.5
NO_ROOM_REFUSED_ABOVE = data_stats.NO_ROOM_SHARE
SOURCE_FILE = DATA_SOURCE_FILE  # what the prepared copy was made from (run_files.DataSource)


def load_source(data: DataConfig):
    """The raw records, from a local file, a local folder, or a Hub dataset id."""
    import datasets

    spec = data.dataset
    path = Path(spec).expanduser()
    try:
        if path.is_file():
            if path.stat().st_size == 0:
                raise StepError(f"data.dataset {spec} is empty: there is nothing to train on")
            if path.suffix.lower() not in DATASET_FILE_FORMATS:
                raise StepError(f"data.dataset {spec}: unsupported file type (use {', '.join(DATASET_FILE_FORMATS)})")
            if path.suffix.lower() in TEXT_FILES:
                check_utf8(path, spec)
            return datasets.load_dataset(DATASET_FILE_FORMATS[path.suffix.lower()], data_files=str(path), split="train")
        if path.is_dir():
            if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
                saved = datasets.load_from_disk(str(path))
                return saved[data.split] if isinstance(saved, datasets.DatasetDict) else saved
            return datasets.load_dataset(str(path), split=data.split)
        if dataset_looks_like_a_path(spec):
            raise StepError(
                f"data.dataset {spec}: no such file or folder (looked in {path.absolute().parent}); a Hub dataset "
                "id has no file suffix"
            )
        return datasets.load_dataset(spec, split=data.split)
    except datasets.exceptions.DatasetGenerationError as exc:
        raise StepError(f"data.dataset {spec} cannot be read: {exc.__cause__ or exc}") from None
    except (FileNotFoundError, ValueError, KeyError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise StepError(f"data.dataset {spec} (split {data.split!r}) cannot be loaded: {exc}") from None
    except OSError as exc:  # the Hub out of reach (ConnectionError, HF_HUB_OFFLINE=1) or refusing
        raise StepError(
            f"data.dataset {spec}: cannot reach it on the Hugging Face Hub ({str(exc).splitlines()[0]}); give the "
            "node Hub access or point data.dataset at a local copy"
        ) from None


def check_utf8(path: Path, spec: str) -> None:
    """A text file must be UTF-8: the first line that is not is named (the loaders' own error names neither)."""
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StepError(
                    f"data.dataset {spec}: line {number} is not UTF-8 text (byte {line[exc.start]:#04x} at column "
                    f"{exc.start + 1}): save the file as UTF-8"
                ) from None


def map_columns(dataset, source: str):
    """Records in a known other layout (alpaca, with or without input) renamed to the dolly columns; others as
    they are."""
    names = set(dataset.column_names)
    for layout, mapping in COLUMN_MAPS.items():
        if "response" not in names and set(mapping) - OPTIONAL_SOURCE_COLUMNS <= names:
            present = {old: new for old, new in mapping.items() if old in names}
            print(f"data.dataset {source}: {layout} columns ({', '.join(present)}) read as dolly's", flush=True)
            return dataset.rename_columns({old: new for old, new in present.items() if old != new})
    return dataset


def check_empty_share(empty: int, total: int, what: str, source: str, fix: str) -> None:
    """Records with nothing to learn from: refused when most are so, else counted in a note."""
    if not empty:
        return
    share = empty / total
    if share > EMPTY_RESPONSES_REFUSED_ABOVE:
        raise StepError(
            f"data.dataset {source}: {empty} of {total} records have {what} ({share:.0%}; refused above "
            f"{EMPTY_RESPONSES_REFUSED_ABOVE:.0%}): {fix}"
        )
    print(f"note: data.dataset {source}: {empty} of {total} records have {what}", flush=True)


def check_responses(dataset, source: str) -> None:
    """Empty or missing responses teach nothing: refused when most records have none, else counted."""
    empty = sum(not (text or "").strip() for text in dataset["response"])
    check_empty_share(
        empty,
        len(dataset),
        "an empty or missing response",
        source,
        "fill the response column, or map the answer column to it",
    )


def validate(dataset, source: str):
    """Keep the dolly columns as strings; stop on an empty dataset, missing columns or (mostly) empty responses."""
    if len(dataset) == 0:
        raise StepError(f"data.dataset {source} is empty: there is nothing to train on")
    dataset = map_columns(dataset, source)
    missing = [name for name in REQUIRED_COLUMNS if name not in dataset.column_names]
    if missing:
        raise StepError(
            f"data.dataset {source} lacks column(s) {', '.join(missing)} (has: {', '.join(dataset.column_names)}); "
            f"dolly records need {', '.join(REQUIRED_COLUMNS)} and optionally context"
        )
    if "context" not in dataset.column_names:
        dataset = dataset.add_column("context", [""] * len(dataset))
    for name in COLUMNS:
        if all(value is None for value in dataset[name]):  # a CSV column empty in every row reads as float NaN
            dataset = dataset.remove_columns(name).add_column(name, [""] * len(dataset))
    for name in COLUMNS:
        dtype = getattr(dataset.features[name], "dtype", None)
        if dtype not in ("string", "large_string", "null"):
            raise StepError(f"data.dataset {source}: column {name} holds {dataset.features[name]}, expected text")
    dataset = dataset.select_columns(list(COLUMNS))
    check_responses(dataset, source)
    return dataset.map(lambda record: {name: record[name] or "" for name in COLUMNS}, desc="cleaning records")


def validate_chat(dataset, data: DataConfig, tokenizer):
    """Keep the messages column; every record a list of {role, content} turns with an assistant turn, and a
    tokenizer whose chat template can format them (and mark the assistant turns for completion-only loss)."""
    source = data.dataset
    if len(dataset) == 0:
        raise StepError(f"data.dataset {source} is empty: there is nothing to train on")
    for row, messages in enumerate(dataset[MESSAGES_COLUMN]):
        turns_ok = isinstance(messages, list) and all(
            isinstance(turn, dict) and turn.get("role") in CHAT_ROLES and isinstance(turn.get("content"), str)
            for turn in messages
        )
        if not turns_ok:
            raise StepError(
                f"data.dataset {source}, record {row}: messages must be a list of {{role, content}} turns with "
                f"role one of {', '.join(CHAT_ROLES)} and text content"
            )
        if not any(turn["role"] == "assistant" for turn in messages):
            raise StepError(f"data.dataset {source}, record {row}: no assistant turn, so nothing to learn from it")
    empty = sum(
        any(turn["role"] == "assistant" and not turn["content"].strip() for turn in messages)
        for messages in dataset[MESSAGES_COLUMN]
    )
    check_empty_share(empty, len(dataset), "an empty assistant turn", source, "fill the assistant turns' content")
    template = tokenizer.chat_template
    template = template.get("default", "") if isinstance(template, dict) else template or ""
    if not template:
        raise StepError(
            f"data.dataset {source} holds chat-format records (messages), but the tokenizer has no chat template: "
            "train a model whose tokenizer has one (an instruct model) or convert the records to the dolly "
            f"columns ({', '.join(COLUMNS)})"
        )
    if data.completion_only_loss and GENERATION_MARKER not in template:
        raise StepError(
            f"data.completion_only_loss needs the tokenizer's chat template to mark assistant turns with "
            f"{GENERATION_MARKER} (it does not), to label the other turns -100 for data.dataset {source}: set "
            "data.completion_only_loss = false to train on every token, or use a template with the marker"
        )
    return dataset.select_columns([MESSAGES_COLUMN])


def validate_prompts(dataset, source: str, needs_answer: bool):
    """GRPO's records: a text prompt each (dolly and alpaca records read as prompt = the formatted instruction and
    context, answer = the response), and an answer where a built-in reward compares with it; other columns stay
    (a user's reward function receives them). A bad record is refused by its row."""
    if len(dataset) == 0:
        raise StepError(f"data.dataset {source} is empty: there is nothing to train on")
    dataset = map_columns(dataset, source)
    names = dataset.column_names
    if PROMPT_COLUMN not in names and "instruction" in names:
        print(f"data.dataset {source}: dolly columns read as prompt (instruction, context) and answer (response)")
        dataset = dataset.map(
            lambda record: {
                PROMPT_COLUMN: format_prompt(record["instruction"] or "", record.get("context") or ""),
                ANSWER_COLUMN: record.get("response") or "",
            },
            remove_columns=[name for name in COLUMNS if name in names],
            desc="prompt records",
        )
    required = [PROMPT_COLUMN, *([ANSWER_COLUMN] if needs_answer else [])]
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise StepError(
            f"data.dataset {source} lacks column(s) {', '.join(missing)} (has: {', '.join(dataset.column_names)}); "
            f"grpo records need {PROMPT_COLUMN}, and {ANSWER_COLUMN} for the exact_match and math_answer rewards"
        )
    for name in required:
        for row, value in enumerate(dataset[name]):
            if not isinstance(value, str) or (name == PROMPT_COLUMN and not value.strip()):
                what = "empty" if isinstance(value, str) or value is None else f"{type(value).__name__}, not text"
                raise StepError(
                    f"data.dataset {source}, record {row}: {name} is {what}: give every record a text {name}"
                )
    return dataset


def validated_records(data: DataConfig, tokenizer, objective: str = "sft", grpo: GrpoConfig | None = None):
    """The loaded records, validated as preference pairs (train.objective dpo), as prompt records (``grpo``: train.
    objective grpo, whose rewards say whether an answer is needed), or as chat-format or dolly records by their
    columns."""
    dataset = load_source(data)
    if objective == "dpo":
        return preference_data.validate_preferences(dataset, data.dataset, tokenizer)
    if grpo is not None:
        return validate_prompts(dataset, data.dataset, needs_answer=bool(set(grpo.rewards) & ANSWER_REWARDS))
    if is_chat(dataset.column_names):
        return validate_chat(dataset, data, tokenizer)
    return validate(dataset, data.dataset)


def grpo_records(cfg: RunConfig) -> GrpoConfig | None:
    """cfg.grpo where the run trains on prompt records (train.objective grpo), else None."""
    return cfg.grpo if cfg.train.objective == "grpo" else None


def split(dataset, data: DataConfig, seed: int):
    import datasets

    if data.max_samples:
        dataset = dataset.select(range(min(data.max_samples, len(dataset))))
    if not data.validation_fraction:
        return datasets.DatasetDict(train=dataset)
    try:
        parts = dataset.train_test_split(test_size=data.validation_fraction, seed=seed)
    except ValueError as exc:
        raise StepError(
            f"data.validation_fraction {data.validation_fraction}: cannot split {len(dataset)} rows ({exc})"
        ) from None
    return datasets.DatasetDict(train=parts["train"], validation=parts["test"])


def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    folder = Path(model_dir)
    model_files.require_model_folder(folder, "the tokenizer is read from it")
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise StepError(f"no usable tokenizer in {folder}: {exc}") from None


def _digest(parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
    return digest.hexdigest()[:16]


def tokenizer_digest(model_dir: str) -> str:
    """The tokenizer files' contents (each training process has just read them to load the tokenizer)."""
    folder = Path(model_dir)
    names = [name for name in model_files.TOKENIZER_DEFINITION_FILES if (folder / name).is_file()]
    return _digest(part for name in names for part in (name, (folder / name).read_bytes()))


def dataset_files_digest(spec: str) -> str:
    """A local dataset file or folder by each file's size and modification time (cheap, and any rewrite
    changes it); "" for a Hub dataset, named by its id and split in the [data] config."""
    path = Path(spec).expanduser()
    if path.is_file():
        files = {path.name: path.stat()}
    elif path.is_dir():
        files = {str(found.relative_to(path)): found.stat() for found in sorted(path.rglob("*")) if found.is_file()}
    else:
        return ""
    return _digest(f"{name}:{stat.st_size}:{stat.st_mtime_ns};" for name, stat in files.items())


def source_record(cfg: RunConfig) -> DataSource:
    """What ``prepare`` makes the copy from, as read back from its file (JSON types)."""
    made = DataSource(
        data=dataclasses.asdict(cfg.data),
        seed=cfg.train.seed,
        tokenizer=tokenizer_digest(cfg.paths.model_dir),
        dataset_files=dataset_files_digest(cfg.data.dataset),
        objective=cfg.train.objective,
    )
    return DataSource.from_json(made.to_json())


def prepare(cfg: RunConfig, tokenizer=None) -> Path:
    """Load, validate, split and save the dataset; write and print the padding report.

    The folder appears complete or not at all (a killed step leaves the previous copy in place).
    """
    tokenizer = tokenizer or load_tokenizer(cfg.paths.model_dir)
    print(f"loading {cfg.data.dataset} (split {cfg.data.split})", flush=True)
    backend = resolve_backend(cfg.train.backend)  # the replicas an epoch's step count is for
    if cfg.data.blocks:
        prepared, report = prepare_blocks(cfg, tokenizer, backend)
        describe = text_blocks.describe_blocks
    elif cfg.train.objective == "dpo":
        prepared = split(validated_records(cfg.data, tokenizer, "dpo"), cfg.data, cfg.train.seed)
        report = preference_data.preference_report(prepared["train"], tokenizer, cfg, backend)
        check_room_for_answers(report, cfg.data)
        describe = preference_data.describe_preferences
    else:
        records = validated_records(cfg.data, tokenizer, grpo=grpo_records(cfg))
        if not is_chat(records.column_names) and PROMPT_COLUMN not in records.column_names:
            data_stats.check_template_fits(tokenizer, cfg.data.max_length)
        prepared = split(records, cfg.data, cfg.train.seed)
        report = data_stats.padding_report(prepared["train"], tokenizer, cfg, backend)
        check_room_for_answers(report, cfg.data)
        describe = data_stats.describe
    target = cfg.paths.data_dir
    with AtomicOutputDir(target, overwrite=True) as partial:
        prepared.save_to_disk(str(partial))
        (partial / SOURCE_FILE).write_text(source_record(cfg).to_json())
        (partial / DATA_STATS_FILE).write_text(report.to_json())
    sizes = ", ".join(f"{name} {len(part)}" for name, part in prepared.items())
    print(f"prepared {sizes} rows in {target}", flush=True)
    print(describe(report), flush=True)
    return target


def check_room_for_answers(report: DataStats, data: DataConfig) -> None:
    """Prompts that fill data.max_length leave the answer out: nothing to learn from them."""
    full, examples = report.counts["prompts_filling_max_length"], report.counts["examples"]
    if full / examples > NO_ROOM_REFUSED_ABOVE:
        raise StepError(
            f"data.max_length {data.max_length}: {full} of {examples} prompts fill it and leave no room for the "
            f"answer ({full / examples:.0%}; refused above {NO_ROOM_REFUSED_ABOVE:.0%}): data.max_length "
            f"{report.counts['max_length_leaving_room']} leaves room in all but {NO_ROOM_REFUSED_ABOVE:.0%} of them"
        )


def prepare_blocks(cfg: RunConfig, tokenizer, backend: str):
    """Block mode: (the split blocks, the report); data.max_samples counts blocks."""
    texts = text_blocks.record_texts(load_source(cfg.data), cfg.data)
    blocks, corpus_tokens, dropped = text_blocks.build_blocks(texts, tokenizer, cfg.data.max_length)
    prepared = split(blocks, cfg.data, cfg.train.seed)
    report = text_blocks.block_report(len(texts), len(prepared["train"]), corpus_tokens, dropped, cfg, backend)
    return prepared, report


def stale_reason(cfg: RunConfig) -> str | None:
    """Why the run folder's prepared data is not this config's, naming what changed; None when it is."""
    target = cfg.paths.data_dir
    record = target / SOURCE_FILE
    if not record.is_file():
        return f"no prepared data in {target}"
    now = source_record(cfg)
    try:
        prepared = DataSource.from_json(record.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return f"{record} is unreadable"
    changed = prepared.changes(now)
    return f"the data in {target} was prepared with another {'; '.join(changed)}" if changed else None


DATA_STEP_COMMAND = "python -m llm_pipeline.data --config RUN.toml"  # what a stale copy's refusal names


def training_inputs(cfg: RunConfig):
    """(prepared datasets, tokenizer) for training, each read once: the data step's copy, refused naming the
    data step when it is missing or not this config's (the train step only trains, whatever its world size)."""
    import datasets

    tokenizer = load_tokenizer(cfg.paths.model_dir)  # first: the copy is then checked against its files
    reason = stale_reason(cfg)
    if reason:
        raise StepError(f"{reason}: run the data step first ({DATA_STEP_COMMAND}; one process: train --prepare-data)")
    say(f"using prepared data from {cfg.paths.data_dir}")
    return datasets.load_from_disk(str(cfg.paths.data_dir)), tokenizer


def prepare_if_stale(cfg: RunConfig) -> None:
    """The data step's own call when the copy is missing or stale (``train --prepare-data``: one process)."""
    reason = stale_reason(cfg)
    if reason:
        say(f"{reason}: preparing it first, as the data step does")
        prepare(cfg)


def preview(cfg: RunConfig, tokenizer_dir: str = "") -> None:
    """Print the first training record as trl tokenizes it, trained span marked, then the padding report.
    ``tokenizer_dir``: a local folder to read the tokenizer from instead of paths.model_dir."""
    import datasets

    from llm_pipeline.training.torch import preview as torch_preview

    datasets.disable_progress_bars()  # a preview prints one record: no bar per map and filter over the records
    if not tokenizer_dir and not Path(cfg.paths.model_dir).is_dir():
        raise StepError(
            f"paths.model_dir {cfg.paths.model_dir} does not exist here (the download step writes it on the "
            "cluster): name a local tokenizer folder with --tokenizer DIR (make rehearse writes a tiny one in "
            ".rehearsal/fsx/models/tiny-llama)"
        )
    tokenizer = load_tokenizer(tokenizer_dir or cfg.paths.model_dir)
    if cfg.data.blocks:
        raise StepError("data.blocks trains on every token of fixed-length blocks: there is no span to preview")
    if cfg.train.objective == "dpo":
        preference_preview(cfg, tokenizer)
        return
    records = validated_records(cfg.data, tokenizer, grpo=grpo_records(cfg))
    if not is_chat(records.column_names) and PROMPT_COLUMN not in records.column_names:
        data_stats.check_template_fits(tokenizer, cfg.data.max_length)
    train = split(records, cfg.data, cfg.train.seed)["train"]
    if PROMPT_COLUMN in train.column_names:  # GRPO: the prompt the rollouts continue, and what rewards read
        first = train[0]
        ids = tokenizer(first[PROMPT_COLUMN])["input_ids"]
        print(
            f"first training prompt of {cfg.data.dataset} ({len(ids)} tokens), as the rollouts receive it", flush=True
        )
        print(first[PROMPT_COLUMN], flush=True)
        others = {key: value for key, value in first.items() if key != PROMPT_COLUMN}
        print(f"its other columns (the reward functions receive them): {others}", flush=True)
        print(data_stats.describe(data_stats.padding_report(train, tokenizer, cfg, resolve_backend(cfg.train.backend))))
        return
    example = torch_preview.prepared_example(cfg, train.select([0]), tokenizer)
    print(f"first training record of {cfg.data.dataset}, as the trainer tokenizes it", flush=True)
    print(torch_preview.describe(example, tokenizer, cfg.data.max_length), flush=True)
    report = data_stats.padding_report(train, tokenizer, cfg, resolve_backend(cfg.train.backend))
    print(data_stats.describe(report), flush=True)


def preference_preview(cfg: RunConfig, tokenizer) -> None:
    """The first training pair as trl's DPOTrainer tokenizes it, each answer's trained span marked, then the report."""
    train = split(validated_records(cfg.data, tokenizer, "dpo"), cfg.data, cfg.train.seed)["train"]
    print(f"first training pair of {cfg.data.dataset}, as the trainer tokenizes it", flush=True)
    print(preference_data.describe_pair(train[0], tokenizer, cfg.data.max_length), flush=True)
    report = preference_data.preference_report(train, tokenizer, cfg, resolve_backend(cfg.train.backend))
    print(preference_data.describe_preferences(report), flush=True)


DESCRIPTION = (
    "Validate, split and save the run's dataset (data.dataset: dolly or chat records, a file, a folder or a Hub id); "
    "report padding with and without packing."
)


def build_parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(prog="python -m llm_pipeline.data", description=DESCRIPTION)
    which = command.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", metavar="RUN.toml", help="the run config: prepare its data (the data step)")
    which.add_argument(
        "--preview",
        metavar="RUN.toml",
        help="print the first training record as the trainer tokenizes it (trained span in [[ ]]) and the padding "
        "report; writes nothing",
    )
    command.add_argument(
        "--tokenizer",
        metavar="DIR",
        default="",
        help="with --preview: read the tokenizer from this local model folder instead of paths.model_dir",
    )
    cli.add_version(command)
    return command


def laptop_folders(config_path: str, env: dict[str, str]) -> dict[str, str]:
    """The HPL_* folder variables ``config_path`` needs that are unset here, given the cluster's values (a
    preview writes nothing, so only the paths it prints show them); a note names them."""
    from cluster_contract import cluster_folders_env  # the laptop's checkout: previews run there

    try:
        text = Path(config_path).read_text()
    except OSError:
        return {}  # the load says what is wrong with the file
    cluster = cluster_folders_env()
    unset = [name for name in sorted(cluster) if f"${{{name}}}" in text and not env.get(name)]  # no default given
    if unset:
        shown = ", ".join(f"{name}={cluster[name]}" for name in unset)
        print(f"note: not set on this machine, the cluster's value stands in: {shown}", file=sys.stderr, flush=True)
    return {name: cluster[name] for name in unset}


def main(argv=None) -> int:
    command = build_parser()
    args = command.parse_args(argv)
    if args.tokenizer and not args.preview:
        command.error("--tokenizer goes with --preview (the data step reads the run's own model folder)")
    if not args.preview:
        return cli.run_config_only_step("data", DESCRIPTION, prepare, ["--config", args.config])
    os.environ.update(laptop_folders(args.preview, dict(os.environ)))
    return cli.run_config_only_step(
        "data", DESCRIPTION, lambda cfg: preview(cfg, args.tokenizer), ["--config", args.preview]
    )


if __name__ == "__main__":
    raise SystemExit(main())
