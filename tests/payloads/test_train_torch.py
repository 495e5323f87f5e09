"""The torch backend end to end on CPU: the tiny model trains, checkpoints, logs, resumes, generates."""

from __future__ import annotations

import json

import pytest
from payload_configs import write_config

from llm_pipeline import generate, train
from llm_pipeline.run_files import ProgressLine
from llm_pipeline.weights.checkpoints import newest_complete, seal_name

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_models_dir, tiny_datasets_dir):
    """One 30-step training run of tiny-cpu.toml (checkpoints every 10 steps), its config and output."""
    folder = tmp_path_factory.mktemp("run")
    env = {
        "HPL_MODELS_DIR": str(tiny_models_dir),
        "HPL_DATASETS_DIR": str(tiny_datasets_dir),
        "HPL_OUTPUTS_DIR": str(folder / "outputs"),
    }
    path = write_config(folder / "run.toml", env, train={"max_steps": 30, "save_steps": 10})
    cfg = train.cli.load(path)
    return path, cfg


def _train(path, capsys, *extra) -> str:
    assert train.main(["--prepare-data", "--config", str(path), *extra]) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def first_output(run):
    """stdout of the first run (captured by hand: capsys is function-scoped)."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert train.main(["--prepare-data", "--config", str(run[0])]) == 0
    return buffer.getvalue()


def _trainer_state(checkpoint):
    return json.loads((checkpoint / "trainer_state.json").read_text())


def test_loss_goes_down(run, first_output):
    cfg = run[1]
    losses = [
        entry["loss"]
        for entry in _trainer_state(cfg.paths.checkpoints_dir / "checkpoint-30")["log_history"]
        if "loss" in entry
    ]
    assert len(losses) == 6  # every 5 steps
    # The tiny model's frozen random lm_head caps how far LoRA on the decoder layers can go.
    assert losses[-1] < losses[0] - 0.1, losses


def test_checkpoints_at_interval_and_final_step_within_the_limit(run, first_output):
    cfg = run[1]
    names = sorted(p.name for p in cfg.paths.checkpoints_dir.glob("checkpoint-*"))
    assert names == ["checkpoint-20", "checkpoint-30"]  # save_total_limit 2
    assert newest_complete(cfg.paths.checkpoints_dir)[0] == 30


def test_progress_throughput_and_trainable_count_on_stdout(first_output):
    assert "method lora: 16,384 trainable parameters (as expected)" in first_output
    lines = [line for line in first_output.splitlines() if line.startswith("step 30/30 | loss")]
    assert lines and "samples/s" in lines[0] and "tokens/s" in lines[0]


def test_train_prepare_data_runs_the_data_steps_preparation_first(run, first_output):
    assert f"no prepared data in {run[1].paths.data_dir}: preparing it first, as the data step does" in first_output
    assert f"rows in {run[1].paths.data_dir}" in first_output  # the data step's own report


def test_tensorboard_events_hold_loss_and_throughput(run, first_output):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run[1].paths.tensorboard_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/samples_per_second",
        "train/tokens_per_second",
        "model/trainable_parameters",
        "eval/loss",
    } <= tags
    assert [event.step for event in events.Scalars("train/loss")] == [5, 10, 15, 20, 25, 30]


def test_saved_adapter_loads_with_peft(run, first_output):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = run[1]
    base = AutoModelForCausalLM.from_pretrained(cfg.paths.model_dir)
    model = PeftModel.from_pretrained(base, cfg.paths.checkpoints_dir / "checkpoint-30")
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert len(lora_b) == 2 * 7 and all(torch.count_nonzero(p) > 0 for p in lora_b)  # trained, not the zero init


def test_generate_answers_with_base_and_adapter(run, first_output, capsys):
    cfg = run[1]
    checkpoint = cfg.paths.checkpoints_dir / "checkpoint-30"
    assert generate.main(["--config", str(run[0]), "--adapter-dir", str(checkpoint)]) == 0
    written = cfg.paths.generation_file.read_text()
    assert written.startswith("### Instruction\nDescribe a llama?\n\n### Answer\n")
    assert len(written.split("### Answer\n", 1)[1].strip()) > 0
    assert written.strip() in capsys.readouterr().out


def test_a_restart_after_a_partial_restore_resumes_from_the_previous_complete_checkpoint(run, first_output, capsys):
    cfg = run[1]
    newest = cfg.paths.checkpoints_dir / "checkpoint-30"
    assert (newest / seal_name(0)).is_file() and (newest / "trainer_state.json").is_file()
    # A spot restart restored trainer_state.json of the newest checkpoint but not its weights.
    (newest / "adapter_model.safetensors").unlink()
    (cfg.paths.checkpoints_dir / "checkpoint-25").mkdir()  # half-written: no seal
    # Step 20 lies inside the second epoch: the resume skips that epoch's first batches, in its own order.
    assert 1 < _trainer_state(cfg.paths.checkpoints_dir / "checkpoint-20")["epoch"] < 2
    prepared = {path.name: path.stat().st_mtime_ns for path in cfg.paths.data_dir.iterdir()}
    out = _train(run[0], capsys)
    # The data the first run prepared is this config's: read as it is, not prepared again.
    assert f"using prepared data from {cfg.paths.data_dir}" in out and "preparing it here" not in out
    assert {path.name: path.stat().st_mtime_ns for path in cfg.paths.data_dir.iterdir()} == prepared
    assert f"resuming from {cfg.paths.checkpoints_dir / 'checkpoint-20'}" in out
    assert "step 25/30 | loss" in out and "step 5/30" not in out

    # The resumed run is the first run's steps 21-30 exactly: the same schedule and the same batches,
    # so the same losses and learning rates as the first run logged them.
    def logged(text: str) -> list[tuple[int, float, float]]:
        return [
            (line.step, line.loss, line.learning_rate) for line in ProgressLine.parse_all(text) if line.step in (25, 30)
        ]

    assert logged(out) == logged(first_output) != []
    assert _trainer_state(newest)["global_step"] == 30
    assert newest_complete(cfg.paths.checkpoints_dir) == (30, newest)  # written again, sealed again


def test_precompile_runs_a_few_steps_and_saves_nothing(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, data={"validation_fraction": 0.0})
    out = _train(path, capsys, "--precompile")
    assert "precompile run with the torch backend" in out and "step 3/3 | loss" in out
    outputs = tmp_path / "outputs" / "tiny-lora"
    assert not (outputs / "checkpoints").exists() or not any((outputs / "checkpoints").iterdir())
    assert not (outputs / "tensorboard").exists()


def test_model_folder_without_config_is_refused(hpl_env, tmp_path, capsys):
    (tmp_path / "empty-model").mkdir()
    path = write_config(tmp_path / "run.toml", hpl_env, paths={"model_dir": str(tmp_path / "empty-model")})
    assert train.main(["--config", str(path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_unknown_scheduler_is_refused(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"lr_scheduler": "zigzag"})
    assert train.main(["--config", str(path)]) == 2
    assert "train.lr_scheduler: invalid value 'zigzag'" in capsys.readouterr().err


def test_bf16_trains_on_cpu(hpl_env, tmp_path, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, train={"bf16": True, "precompile_steps": 2})
    out = _train(path, capsys, "--precompile")
    assert "step 2/2 | loss" in out
