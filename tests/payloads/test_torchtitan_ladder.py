"""The ladder's torchtitan job files: composed from one base TOML, accepted by torchtitan 0.2.2 itself.

The rung files are parsed by torchtitan's own ConfigManager (in .venv/torchtitan-site, see
torchtitan_site.py), exactly as `python -m torchtitan.train --job.config_file <file>` does.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import tomllib
from torchtitan_site import probe

from llm_pipeline import config
from llm_pipeline.errors import StepError
from llm_pipeline.training.torchtitan import ladder

# Its module fixture runs torchtitan (seconds): one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("torchtitan_ladder")

CONFIGS = Path(__file__).resolve().parents[2] / "payloads" / "configs"
PRETRAIN = CONFIGS / "llama3-8b-pretrain.toml"
TINY_LADDER = CONFIGS / "tiny-ladder-cpu.toml"
ONE_GPU = CONFIGS / "llama3-1b-pretrain-1gpu.toml"
ENV = {"HPL_MODELS_DIR": "/fsx/models", "HPL_DATASETS_DIR": "/fsx/datasets"}


def pretrain_config(tmp_path: Path, **torchtitan) -> config.RunConfig:
    cfg = config.load(PRETRAIN, env={**ENV, "HPL_OUTPUTS_DIR": str(tmp_path)})
    return dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, **torchtitan))


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    """Every rung of the 8B ladder and of the rehearsal ladder, plus a misspelt one, through ConfigManager."""
    root = tmp_path_factory.mktemp("ladder")
    cfg = pretrain_config(root / "8b", overrides=("checkpoint.interval = 250", "training.local_batch_size = 2"))
    tiny = config.load(TINY_LADDER, env={**ENV, "HPL_OUTPUTS_DIR": str(root / "tiny")})
    files = [ladder.write_job_file(cfg, rung) for rung in config.TORCHTITAN_RUNGS]
    files += [ladder.write_job_file(tiny, rung) for rung in config.TORCHTITAN_RUNGS]
    one_gpu = config.load(ONE_GPU, env={**ENV, "HPL_OUTPUTS_DIR": str(root / "1b")})
    files += [ladder.write_job_file(one_gpu, rung) for rung in one_gpu.torchtitan.rungs]
    profiled = pretrain_config(root / "rowwise", profile=True, memory_snapshot=True)
    files.append(ladder.write_job_file(profiled, "fp8_rowwise"))
    misspelt = pretrain_config(root / "bad", overrides=("training.stepz = 5",))
    files.append(ladder.write_job_file(misspelt, "baseline"))
    answers = probe("parse", *map(str, files))
    groups = [answers[:4], answers[4:8], answers[8:11], [answers[11]]]
    ladders = dict(zip(["8b", "tiny", "1b", "rowwise"], groups, strict=True))
    return cfg, ladders, answers[12:]


def test_every_rung_parses_with_torchtitans_config_manager(parsed):
    _, ladders, _ = parsed
    for answers in ladders.values():
        assert [a.get("error") for a in answers] == [None] * len(answers)
        assert [a["unknown_converters"] for a in answers] == [[]] * len(answers)  # names torchtitan 0.2.2 registers
        assert all(a["flavor_known"] for a in answers)
    base = ladders["8b"][0]["config"]
    assert (base["model"]["name"], base["model"]["flavor"], base["training"]["seq_len"]) == ("llama3", "8B", 8192)
    assert base["training"]["dataset"] == "c4"


def test_each_rung_adds_its_options_to_the_one_before(parsed):
    _, ladders, _ = parsed
    rows = []
    for answer in ladders["8b"]:
        job = answer["config"]
        fp8 = job["quantize"]["linear"]["float8"]
        rows.append(
            (
                job["compile"]["enable"],
                job["model"]["converters"],
                fp8["enable_fsdp_float8_all_gather"],
                fp8["precompute_float8_dynamic_scale_for_fsdp"],
                fp8["recipe_name"],  # None: torchtitan then uses tensorwise scaling
                fp8["filter_fqns"],
            )
        )
    assert rows == [
        (False, [], False, False, None, ["output"]),
        (True, [], False, False, None, ["output"]),
        (True, ["quantize.linear.float8"], False, False, None, ["output"]),
        (True, ["quantize.linear.float8"], True, True, None, ["output"]),
    ]


def test_the_run_sets_folders_steps_and_overrides_in_every_rung(parsed, tmp_path):
    cfg, ladders, _ = parsed
    run = Path(cfg.paths.output_dir)
    for rung, answer in zip(config.TORCHTITAN_RUNGS, ladders["8b"], strict=True):
        job = answer["config"]
        assert job["job"]["dump_folder"] == str(run / "ladder" / rung)
        assert job["metrics"]["save_tb_folder"] == str(run / "tensorboard" / rung)
        assert job["metrics"]["enable_tensorboard"] is True
        assert job["model"]["hf_assets_path"] == cfg.paths.model_dir
        assert job["training"]["steps"] == 2000
        # DCP checkpoints under the run folder on FSx, so a restarted rung resumes from step-N
        assert (job["checkpoint"]["enable"], job["checkpoint"]["folder"]) == (True, "checkpoint")
        assert (job["checkpoint"]["interval"], job["training"]["local_batch_size"]) == (250, 2)  # overrides


def test_the_one_gpu_ladder_trains_the_1b_flavor_registered_through_torchtitans_custom_import(parsed):
    _, ladders, _ = parsed
    jobs = [answer["config"] for answer in ladders["1b"]]
    assert [job["experimental"]["custom_import"] for job in jobs] == ["llm_pipeline.training.torchtitan.flavors"] * 3
    assert {(job["model"]["name"], job["model"]["flavor"]) for job in jobs} == {("llama3_ladder", "1B")}
    assert [job["model"]["converters"] for job in jobs] == [[], [], ["quantize.linear.float8"]]


def test_the_rowwise_rung_climbs_from_compile_and_the_profilers_are_keys(parsed):
    _, ladders, _ = parsed
    job = ladders["rowwise"][0]["config"]
    fp8 = job["quantize"]["linear"]["float8"]
    assert (job["compile"]["enable"], job["model"]["converters"]) == (True, ["quantize.linear.float8"])
    assert (fp8["recipe_name"], fp8["enable_fsdp_float8_all_gather"]) == ("rowwise", False)  # torchtitan refuses both
    profiling = job["profiling"]
    assert (profiling["enable_profiling"], profiling["enable_memory_snapshot"]) == (True, True)
    # relative to the rung's dump folder: in the run folder, exported with the outputs
    assert (profiling["save_traces_folder"], profiling["save_memory_snapshot_folder"]) == (
        "profile_traces",
        "memory_snapshot",
    )
    assert ladders["8b"][0]["config"]["profiling"]["enable_profiling"] is False  # off unless asked


def test_torchtitan_refuses_a_misspelt_override(parsed):
    _, _, bad = parsed
    assert "Invalid field names" in bad[0]["error"] and "stepz" in bad[0]["error"]


def test_job_file_round_trips_through_tomllib(tmp_path):
    cfg = pretrain_config(tmp_path)
    path = ladder.write_job_file(cfg, "fp8_allgather")
    assert tomllib.loads(path.read_text()) == ladder.compose(cfg, "fp8_allgather")
    assert path.read_text().startswith("# torchtitan 0.2.2 job for ladder rung 'fp8_allgather'")


def test_toml_text_writes_every_value_kind_back_exactly():
    tables = {
        "a": {"x": 3e-4, "y": 1e-08, "n": -2, "s": 'quote " and \\ back', "on": True, "l": ["p", "q"]},
        "b": {"c": {"d": {"e": [[1, 2], [3]]}}, "f": 0.1},
        "empty": {},
    }
    assert tomllib.loads(ladder.toml_text(tables)) == tables
    assert math.isinf(tomllib.loads(ladder.toml_text({"t": {"v": math.inf}}))["t"]["v"])


def test_overrides_win_over_the_rung_options(tmp_path):
    cfg = pretrain_config(tmp_path, overrides=("compile.enable = false",))
    assert ladder.compose(cfg, "fp8")["compile"]["enable"] is False
    assert ladder.compose(cfg, "fp8")["model"]["converters"] == ["quantize.linear.float8"]


@pytest.mark.parametrize(
    ("torchtitan", "message"),
    [
        ({"rungs": ["baseline", "fp16"]}, "torchtitan.rungs: invalid value 'fp16'"),
        ({"rungs": ["compile", "compile"]}, "torchtitan.rungs: invalid value ['compile', 'compile']"),
        ({"rungs": []}, "torchtitan.rungs: invalid value []"),
        ({"steps": 0}, "torchtitan.steps: invalid value 0"),
        ({"overrides": ["steps = 3"]}, "torchtitan.overrides: invalid value 'steps = 3'"),
    ],
)
def test_bad_ladder_settings_name_the_key(tmp_path, torchtitan, message):
    raw = tomllib.loads(PRETRAIN.read_text())
    raw["torchtitan"].update(torchtitan)
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        config.from_dict(raw, env={**ENV, "HPL_OUTPUTS_DIR": str(tmp_path)})


def test_bad_job_file_or_override_value_is_a_clear_error(tmp_path):
    with pytest.raises(StepError, match=r"torchtitan\.job_file .*missing\.toml does not exist"):
        ladder.compose(pretrain_config(tmp_path, job_file=str(tmp_path / "missing.toml")), "baseline")
    with pytest.raises(StepError, match=re.escape("torchtitan.overrides: 'training.steps = ' is not a TOML line")):
        ladder.compose(pretrain_config(tmp_path, overrides=("training.steps = ",)), "baseline")


def test_job_file_path_is_read_under_payloads_when_relative(tmp_path):
    cfg = pretrain_config(tmp_path)
    assert ladder.job_file_path(cfg) == CONFIGS / "torchtitan" / "llama3_8b.toml"
    absolute = tmp_path / "mine.toml"
    assert ladder.job_file_path(pretrain_config(tmp_path, job_file=str(absolute))) == absolute
