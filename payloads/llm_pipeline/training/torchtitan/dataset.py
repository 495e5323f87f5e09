"""Stage the ladder's dataset on FSx once, so every rank of every rung reads a local copy.

torchtitan 0.2.2 reads c4 with `datasets.load_dataset(path, name="en", split=..., streaming=True)`
(torchtitan/hf_datasets/text_datasets.py), `path` being `training.dataset_path` or the Hub id. From
the Hub that is one stream per rank: 32 ranks at once risk HTTP 429 mid-run. A local folder works
only with its dataset card: c4's README.md defines the "en" config and its data files in its YAML
header; without it datasets raises "BuilderConfig 'en' not found".

The dataset step copies `torchtitan.dataset_files` of `torchtitan.dataset_source` (a Hub dataset,
or a folder) and the card files into `torchtitan.dataset_dir`, reads the first record back the
way torchtitan does, and records what it staged (.staged.json). A later run with the same source
and patterns whose files are all there skips the copy.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError

CARD_FILES = ("README.md", "dataset_infos.json")  # the card (YAML configs) and the older infos file
RECORD = ".staged.json"
C4_CONFIG = "en"  # the config name torchtitan's c4 loader asks for


def matching(folder: Path, patterns: list[str]) -> list[str]:
    """Files under `folder` (relative POSIX paths) that match one of `patterns`, sorted."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not relative.startswith(".") and any(fnmatch.fnmatch(relative, p) for p in patterns):
            found.append(relative)
    return sorted(found)


def recorded_complete(target: Path, wanted: dict) -> bool:
    record = target / RECORD
    if not record.is_file():
        return False
    try:
        staged = json.loads(record.read_text())
    except ValueError:
        return False
    same = all(staged.get(key) == value for key, value in wanted.items())
    return same and all((target / name).is_file() for name in staged.get("files", ["?"]))


def copy_from_folder(source: Path, target: Path, patterns: list[str]) -> None:
    if not source.is_dir():
        raise StepError(f"torchtitan.dataset_source {source} is not a folder (nor a Hub dataset id)")
    for name in matching(source, patterns):
        destination = target / name
        if destination.is_file() and destination.stat().st_size == (source / name).stat().st_size:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        print(f"copying {source / name} -> {destination}", flush=True)
        tmp = destination.with_name(destination.name + ".tmp")
        shutil.copyfile(source / name, tmp)
        tmp.replace(destination)


def download_from_hub(repo: str, target: Path, patterns: list[str], endpoint: str | None) -> None:
    from huggingface_hub import snapshot_download

    print(f"downloading {', '.join(patterns)} of the Hub dataset {repo} into {target}", flush=True)
    try:
        snapshot_download(
            repo, repo_type="dataset", local_dir=target, allow_patterns=patterns, endpoint=endpoint
        )  # the token: HF_TOKEN or `huggingface-cli login`, as huggingface_hub finds it
    except Exception as exc:  # the Hub's errors become one line naming the dataset
        raise StepError(f"torchtitan.dataset_source {repo}: the Hub download failed: {exc}") from None


def check_loads(target: Path) -> str:
    """Read the first training record as torchtitan's c4 loader does; its text."""
    from datasets import load_dataset

    try:
        record = next(iter(load_dataset(str(target), name=C4_CONFIG, split="train", streaming=True)))
    except Exception as exc:
        raise StepError(
            f"the staged copy {target} does not load as torchtitan reads c4 "
            f"(load_dataset(path, name={C4_CONFIG!r}, split='train')): {exc}; check torchtitan.dataset_files "
            "and that the source's README.md defines that config"
        ) from None
    return str(record["text"])


def stage(cfg: RunConfig, endpoint: str | None = None) -> Path | None:
    """Stage the dataset (or find it staged); None when torchtitan.dataset_source is empty."""
    titan = cfg.torchtitan
    if not titan.dataset_source:
        print("torchtitan.dataset_source is empty: no staging; the rungs stream their dataset from the Hub", flush=True)
        return None
    target = Path(titan.dataset_dir)
    wanted = {"source": titan.dataset_source, "patterns": list(titan.dataset_files)}
    if recorded_complete(target, wanted):
        print(f"{target} already holds {titan.dataset_source} ({', '.join(titan.dataset_files)}): not staged again")
        return target
    target.mkdir(parents=True, exist_ok=True)
    (target / RECORD).unlink(missing_ok=True)
    patterns = [*CARD_FILES, *titan.dataset_files]
    source = Path(titan.dataset_source).expanduser()
    if source.is_absolute():
        copy_from_folder(source, target, patterns)
    else:
        endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now (mirrors, tests)
        download_from_hub(titan.dataset_source, target, patterns, endpoint)
    if not (target / "README.md").is_file():
        raise StepError(f"torchtitan.dataset_source {titan.dataset_source} has no README.md (its dataset card)")
    files = matching(target, patterns)
    data = [name for name in files if name not in CARD_FILES]
    if not data:
        raise StepError(f"torchtitan.dataset_files {list(titan.dataset_files)} match no file of {titan.dataset_source}")
    text = check_loads(target)
    size = sum((target / name).stat().st_size for name in files)
    record = target / RECORD
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({**wanted, "files": files, "bytes": size}, indent=2) + "\n")
    tmp.replace(record)
    print(
        f"staged {len(data)} data files ({size / 2**30:.2f} GiB) in {target}; first record: {text[:60]!r}", flush=True
    )
    return target
