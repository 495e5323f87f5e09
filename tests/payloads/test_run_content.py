"""A run is what trained it, through the real train, consolidate and merge steps on the tiny model (CPU torch
engine): every history in HISTORIES, with kills inside a step, after the last save, inside consolidate and
inside merge, changed keys of every learning table, refilled model weights and a dataset rewritten in place,
ends in the uninterrupted run's result (its checkpoint, marker, adapter and merged model, byte for byte) or in a
one-line refusal naming what changed. test_run_state.py holds the state rules' fast cases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from payload_configs import write_config

from llm_pipeline import consolidate, merge, run_state, train
from llm_pipeline.config import LEARNING_SECTIONS
from llm_pipeline.jobs.run_facts import read_run_facts
from llm_pipeline.run_files import TRAINED_FROM_FILE
from llm_pipeline.submit import SubmitError, check_earlier_outputs
from llm_pipeline.training.torch import backend
from tools import tiny_model

pytestmark = pytest.mark.engine

RUN = {"max_steps": 4, "save_steps": 2, "save_total_limit": 10, "logging_steps": 1, "lr_scheduler": "linear"}
# One changed key of every learning table (config.LEARNING_SECTIONS), and its value in the refusal.
CHANGED = {
    "model": ("revision", "other", "model.revision (finished with 'main', now 'other')"),
    "data": ("max_length", 96, "data.max_length (finished with 128, now 96)"),
    "lora": ("r", 16, "lora.r (finished with 8, now 16)"),
    "train": ("learning_rate", 1e-3, "train.learning_rate (finished with 0.005, now 0.001)"),
    "dpo": ("beta", 0.2, "dpo.beta (finished with 0.1, now 0.2)"),
}


class Killed(BaseException):
    """The job was killed here (scancel, a node failure): nothing of the step's own handling runs."""


def _kill_inside_step(monkeypatch, step: int) -> None:
    """Killed inside optimizer step ``step``: its forward pass ran, its update did not."""
    built = backend.build_trainer

    def killing(*args, **kwargs):
        trainer, tokens = built(*args, **kwargs)
        compute = trainer.compute_loss

        def compute_loss(*inner, **options):
            if trainer.state.global_step + 1 == step:
                raise Killed(step)
            return compute(*inner, **options)

        trainer.compute_loss = compute_loss
        return trainer, tokens

    monkeypatch.setattr(backend, "build_trainer", killing)


def _kill_after_last_save(monkeypatch) -> None:
    def killed(*args, **kwargs):
        raise Killed("after the last save, before the marker")

    monkeypatch.setattr(run_state, "mark_if_finished", killed)


def _kill_inside_consolidate(monkeypatch) -> None:
    copy = consolidate.copy_plain

    def killed(adapter, partial):
        copy(adapter, partial)  # the files are written, the folder not yet renamed into place
        raise Killed("inside consolidate")

    monkeypatch.setattr(consolidate, "copy_plain", killed)


def _kill_inside_merge(monkeypatch) -> None:
    def killed(shard, target, *args, **kwargs):
        target.write_bytes(shard.path.read_bytes()[:100])  # a shard cut short
        raise Killed("inside merge")

    monkeypatch.setattr(merge, "merge_shard", killed)


class Run:
    """One run folder, its config file and the steps' CLIs on it."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env
        self.folder = Path(env["HPL_OUTPUTS_DIR"]) / "tiny-lora"
        self.checkpoints = self.folder / "checkpoints"

    def config(self, **sections) -> Path:
        sections["train"] = {**RUN, **sections.get("train", {})}
        sections["data"] = {"validation_fraction": 0.0, **sections.get("data", {})}
        return write_config(self.root / "run.toml", self.env, **sections)

    def train(self, *extra: str, **sections) -> int:
        return train.main(["--prepare-data", "--config", str(self.config(**sections)), *extra])

    def step(self, module, **sections) -> int:
        return module.main(["--config", str(self.config(**sections)), "--overwrite"])

    def result(self) -> dict[str, bytes]:
        """Every file the run's result is made of: the finished checkpoint's adapter, the marker, the outputs."""
        files = {"finished.json": run_state.marker_path(self.checkpoints).read_bytes()}
        finished = run_state.finished_checkpoint(self.checkpoints)
        for name in ("adapter_model.safetensors", TRAINED_FROM_FILE):
            files[f"checkpoint/{name}"] = (finished / name).read_bytes()
        for output in ("adapter", "merged"):
            for path in sorted((self.folder / output).glob("*.safetensors")):
                files[f"{output}/{path.name}"] = path.read_bytes()
        return files


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_models_dir, tiny_datasets_dir) -> dict[str, str]:
    """The module's own model and dataset file, which some histories change (and put back): every run folder of
    the module reads them at the same paths, as the runs of one team share inputs."""
    root = tmp_path_factory.mktemp("inputs")
    shutil.copytree(tiny_models_dir, root / "models")
    shutil.copytree(tiny_datasets_dir, root / "datasets")
    return {"HPL_MODELS_DIR": str(root / "models"), "HPL_DATASETS_DIR": str(root / "datasets")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> Run:
    """The uninterrupted run: train to step 4, consolidate, merge."""
    root = tmp_path_factory.mktemp("reference")
    run = Run(root, {**inputs, "HPL_OUTPUTS_DIR": str(root / "out")})
    assert run.train() == 0
    assert run.step(consolidate) == 0 and run.step(merge) == 0
    return run


@pytest.fixture
def fresh(tmp_path, inputs) -> Run:
    """A run folder of its own."""
    return Run(tmp_path, {**inputs, "HPL_OUTPUTS_DIR": str(tmp_path / "out")})


def _finished_copy(reference: Run, run: Run) -> Run:
    """``run`` holding the reference's finished run folder (checkpoints, data, outputs), as if it had trained it."""
    shutil.copytree(reference.folder, run.folder)
    return run


def _refused(capsys, *named: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for name in named:
        assert name in err, err
    return err


def killed_inside_step_3(run, reference, monkeypatch, capsys):
    _kill_inside_step(monkeypatch, 3)
    with pytest.raises(Killed):
        run.train()
    monkeypatch.undo()
    assert run_state.read_finished(run.checkpoints) is None
    assert run.train() == 0


def killed_after_the_last_save_then_changed_keys(run, reference, monkeypatch, capsys):
    _kill_after_last_save(monkeypatch)
    with pytest.raises(Killed):
        run.train()
    monkeypatch.undo()
    assert run_state.read_finished(run.checkpoints) is None  # checkpoint-4 is there, the marker is not
    capsys.readouterr()
    for section, (key, value, named) in CHANGED.items():
        assert run.train(**{section: {key: value}}) == 2
        _refused(capsys, named, "--replace-outputs", "new run folder")
        assert run_state.read_finished(run.checkpoints) is None  # never a marker of what did not train it
    assert run.train(train={"logging_steps": 2}) == 0  # learns nothing: the marker, copied from checkpoint-4
    assert "nothing to do" in capsys.readouterr().out


def killed_inside_consolidate_and_merge(run, reference, monkeypatch, capsys):
    assert run.train() == 0
    for step, kill in ((consolidate, _kill_inside_consolidate), (merge, _kill_inside_merge)):
        kill(monkeypatch)
        with pytest.raises(Killed):
            run.step(step)
        monkeypatch.undo()
        assert not (run.folder / ("adapter" if step is consolidate else "merged")).exists()
        assert run.step(step) == 0


def refilled_model_weights(run, reference, monkeypatch, capsys):
    _finished_copy(reference, run)
    model = Path(run.env["HPL_MODELS_DIR"]) / "tiny-llama"
    kept = shutil.copytree(model, run.root / "kept-model")
    tiny_model.write_tiny_model(model, seed=1)  # other weights, same shapes and tokenizer
    capsys.readouterr()
    try:
        assert run.train() == 2
        _refused(capsys, "model weights (", "--replace-outputs")
        assert run.step(merge) == 2  # never the old adapter onto new weights
        _refused(capsys, "merge would ship", "model weights (")
        assert run.train(train={"max_steps": 6}) == 2  # nor trained on by an extension
        _refused(capsys, "keeps its model", "model weights (")
    finally:
        shutil.rmtree(model)
        shutil.copytree(kept, model)  # the weights it trained from again


def dataset_rewritten_in_place(run, reference, monkeypatch, capsys):
    _finished_copy(reference, run)
    dataset = Path(run.env["HPL_DATASETS_DIR"]) / "tiny-dolly.jsonl"
    original = dataset.read_bytes()
    tiny_model.write_dolly_jsonl(dataset, 200, seed=1)
    capsys.readouterr()
    try:
        assert train.main(["--config", str(run.config())]) == 2  # without --prepare-data: the file itself
        _refused(capsys, "dataset (the local file(s) data.dataset names: changed since)")
        prepared = (run.folder / "data" / "source.json").read_bytes()
        assert run.train() == 2  # --prepare-data: refused before the data step prepares the new file over the run's
        _refused(capsys, "dataset (")
        assert (run.folder / "data" / "source.json").read_bytes() == prepared
    finally:
        dataset.write_bytes(original)
    assert run.train() == 0  # the same file again: prepared again, equal to what trained it
    assert "nothing to do" in capsys.readouterr().out


def consolidate_after_raising_max_steps(run, reference, monkeypatch, capsys):
    _finished_copy(reference, run)
    capsys.readouterr()
    for step in (consolidate, merge):
        assert run.step(step, train={"max_steps": 6}) == 2
        _refused(capsys, "would ship", "checkpoint-4", "train.max_steps (finished with 4, now 6)")
    facts = read_run_facts(run.config(train={"max_steps": 6}), {})
    with pytest.raises(SubmitError, match=r"submit --from consolidate would ship checkpoint-4.*train\.max_steps"):
        check_earlier_outputs(facts, "consolidate", replace=False)


def extended_then_killed_inside_step_5(run, reference, monkeypatch, capsys):
    """An extension is another run (no reference): it trains on from checkpoint-4 and is finished at its new end."""
    _finished_copy(reference, run)
    _kill_inside_step(monkeypatch, 5)
    with pytest.raises(Killed):
        run.train(train={"max_steps": 6})
    monkeypatch.undo()
    assert run_state.read_finished(run.checkpoints) is None
    assert run.train() == 0  # back to 4: checkpoint-4 is still the newest, the end of the run it finished
    assert run_state.read_finished(run.checkpoints).step == 4
    assert run.train(train={"max_steps": 6}) == 0
    assert run_state.read_finished(run.checkpoints).step == 6
    assert run_state.checkpoint_record(run.checkpoints / "checkpoint-6").learned["train"]["max_steps"] == 6
    return "extended"


HISTORIES = [
    killed_inside_step_3,
    killed_after_the_last_save_then_changed_keys,
    killed_inside_consolidate_and_merge,
    refilled_model_weights,
    dataset_rewritten_in_place,
    consolidate_after_raising_max_steps,
    extended_then_killed_inside_step_5,
]


def test_every_learning_table_has_a_changed_key():
    assert set(CHANGED) == set(LEARNING_SECTIONS)


@pytest.mark.parametrize("history", HISTORIES, ids=[history.__name__ for history in HISTORIES])
def test_every_history_ends_in_the_uninterrupted_result_or_a_refusal(reference, fresh, history, monkeypatch, capsys):
    if history(fresh, reference, monkeypatch, capsys) == "extended":
        return
    if not (fresh.folder / "merged").exists():  # the history ended after train: ship it as the chain would
        assert fresh.step(consolidate) == 0 and fresh.step(merge) == 0
    assert fresh.result() == reference.result()
