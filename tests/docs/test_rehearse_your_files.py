"""`python -m tools.rehearse --config ~/mydata/my-run.toml` and `make rehearse CONFIG=...` (--tiny), up to the
chain: the rehearsal's run config reads the user's own local dataset where it is and points everything it writes
(the tiny model, the run folder) under its root; write_inputs writes only there; a dataset it cannot use is
refused before anything starts, in one line naming the file. The chain itself, run as a normal user's rehearsal
with every file outside its root checksummed, is tests/docs/test_newcomer_journey.py (its last rehearsal)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llm_pipeline import config
from llm_pipeline.jobs.run_config_text import with_keys
from tools import rehearse
from tools.rehearse import DEFAULT_CONFIG, RehearsalError, check_config, fsx_environment, run_config, write_inputs

RECORDS = 30
MARKER = "Which zeppelin carried the quokka"  # an instruction no dolly stand-in record has


def your_records(path: Path, count: int = RECORDS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"instruction": f"{MARKER} {n}?", "context": "", "response": f"The number {n}."} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def your_config(folder: Path, dataset: str) -> Path:
    """A user's run config: their dataset, and a model folder and run folder of their own beside it (relative)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = {("data", "dataset"): dataset, ("paths", "model_dir"): "models/base", ("paths", "output_dir"): "runs/mine"}
    path = folder / "my-run.toml"
    path.write_text(with_keys(DEFAULT_CONFIG.read_text(), keys))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("tiny", [True, False], ids=["make-rehearse-CONFIG", "--config"])
@pytest.mark.parametrize("form", ["absolute", "relative"])
def test_the_rehearsal_reads_your_dataset_where_it_is_and_writes_only_under_its_root(tmp_path, form, tiny):
    mydata, root = tmp_path / "home" / "mydata", tmp_path / "rehearsal"
    records = your_records(mydata / "records.jsonl")
    path = your_config(mydata, str(records) if form == "absolute" else "records.jsonl")
    before = snapshot(tmp_path / "home")

    data = check_config(path, root, None, trn2=False, tiny=tiny)
    assert (data.yours, data.records) == (records, RECORDS)
    assert data.line(root / "fsx") == (
        f"rehearsing your dataset {records} ({RECORDS} records) with the tiny model, under {root / 'fsx'}"
    )
    root.mkdir()  # the rehearsal's lock makes it
    derived = run_config(path, root, None, trn2=False, tiny=tiny, data=data)
    env = fsx_environment(root / "fsx")
    cfg = config.load(derived, env=env)
    assert derived.parent == root and cfg.data.dataset == str(records)
    for written in (cfg.paths.model_dir, cfg.paths.output_dir, cfg.paths.compile_cache_dir):
        assert Path(written).is_relative_to(root / "fsx"), written
    write_inputs(derived, env)
    assert (Path(cfg.paths.model_dir) / "config.json").is_file()
    assert snapshot(tmp_path / "home") == before  # your dataset as it was, no model or run folder beside it


@pytest.mark.parametrize(
    ("dataset", "says"),
    [
        ("databricks/databricks-dolly-15k", "standing in for data.dataset databricks/databricks-dolly-15k, a Hub id"),
        ("${HPL_DATASETS_DIR}/dolly.jsonl", "a path on the cluster"),
    ],
)
def test_a_hub_id_or_a_cluster_path_gets_the_rehearsals_own_records_and_says_so(tmp_path, dataset, says):
    root = tmp_path / "rehearsal"
    path = your_config(tmp_path / "mydata", dataset)
    data = check_config(path, root, None, trn2=False, tiny=True)
    assert data.yours is None and says in data.line(root / "fsx")
    root.mkdir()
    assert data.line(root / "fsx").startswith(f"writing the tiny model and {rehearse.DOLLY_RECORDS} dolly records")
    env = fsx_environment(root / "fsx")
    derived = run_config(path, root, None, trn2=False, tiny=True, data=data)
    cfg = config.load(derived, env=env)
    write_inputs(derived, env)
    assert Path(cfg.data.dataset).parent == root / "fsx" / "datasets"
    assert len(Path(cfg.data.dataset).read_text().splitlines()) == rehearse.DOLLY_RECORDS


def test_the_default_config_rehearses_its_own_records_in_its_own_run_folder(tmp_path):
    root = tmp_path / "rehearsal"
    data = check_config(DEFAULT_CONFIG, root, None, trn2=False, tiny=False)
    root.mkdir()
    cfg = config.load(
        run_config(DEFAULT_CONFIG, root, None, trn2=False, tiny=False, data=data),
        env=rehearse.fsx_environment(root / "fsx"),
    )
    assert data.yours is None and cfg.paths.output_dir == str(root / "fsx" / "outputs" / "tiny-lora")
    assert cfg.data.dataset == str(root / "fsx" / "datasets" / "tiny-dolly.jsonl")


def not_utf8(path: Path) -> None:
    your_records(path, 3)
    path.write_bytes(path.read_bytes() + b'{"instruction": "caf\xe9", "response": "x"}\n')


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda path: None, "no such file or folder"),
        (lambda path: path.write_text('{"question": "a", "answer": "b"}\n'), "lacks column(s) instruction, response"),
        (not_utf8, "line 4 is not UTF-8 text"),
        (lambda path: path.write_text(""), "is empty"),
    ],
    ids=["missing", "columns", "not-utf8", "empty"],
)
def test_a_dataset_it_cannot_use_is_refused_in_one_line_naming_it_before_anything_starts(tmp_path, capsys, make, says):
    mydata, root = tmp_path / "mydata", tmp_path / "rehearsal"
    mydata.mkdir()
    make(mydata / "records.jsonl")
    path = your_config(mydata, "records.jsonl")
    assert rehearse.main(["--root", str(root), "--config", str(path), "--tiny"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: CONFIG={path}: data.dataset {mydata / 'records.jsonl'}") and says in err, err
    assert not root.exists()  # no Slurm started, nothing written


def test_write_inputs_refuses_a_model_folder_outside_the_rehearsals_root(tmp_path):
    path = your_config(tmp_path / "mydata", "${HPL_DATASETS_DIR}/d.jsonl")
    with pytest.raises(RehearsalError, match=r"paths.model_dir .*/mydata/models/base is outside the rehearsal's"):
        write_inputs(path, fsx_environment(tmp_path / "rehearsal" / "fsx"))
    assert sorted(p.name for p in (tmp_path / "mydata").iterdir()) == ["my-run.toml"]
