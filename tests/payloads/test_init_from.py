"""train.init_from: the named run folder and its merged model as paths.model_dir, its refusals, a derived run's copy
(smoke stage, sweep) starting from the same run, and the download step that reads that model and never writes it."""

from __future__ import annotations

import shutil

import pytest
from payload_configs import tiny_config

from llm_pipeline import config, download
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.run_config_text import derived_config


def run_from(env, init_from: str) -> config.RunConfig:
    raw = {"train": {"init_from": init_from}, "paths": {"output_dir": "${HPL_OUTPUTS_DIR}/tiny-lora"}}
    return config.from_dict(raw, env=env)


def test_a_name_is_a_run_beside_this_one_and_its_merged_model_the_base(hpl_env):
    cfg = run_from(hpl_env, "sft")
    outputs = hpl_env["HPL_OUTPUTS_DIR"]
    assert (cfg.train.init_from, cfg.paths.model_dir) == (f"{outputs}/sft", f"{outputs}/sft/merged")
    absolute = run_from(hpl_env, "/elsewhere/run-a")
    assert absolute.paths.model_dir == "/elsewhere/run-a/merged"
    assert "init_from" in config.learning_keys()["train"]  # a finished run resubmitted from another run: refused


@pytest.mark.parametrize(
    ("init_from", "words"),
    [
        ("runs/sft", "train.init_from: 'runs/sft' is a relative path"),
        ("tiny-lora", "train.init_from: 'tiny-lora' is this run's own folder"),
    ],
)
def test_a_relative_path_or_the_run_itself_is_refused(hpl_env, init_from, words):
    with pytest.raises(config.ConfigError, match=words):
        run_from(hpl_env, init_from)


def test_paths_model_dir_beside_it_is_refused(hpl_env):
    with pytest.raises(config.ConfigError, match=r"^paths.model_dir: train.init_from sets it"):
        tiny_config(hpl_env, train={"init_from": "sft"})  # tiny-cpu.toml sets paths.model_dir


def test_a_derived_run_elsewhere_starts_from_the_same_run(tmp_path, hpl_env):
    source = tmp_path / "dpo.toml"
    source.write_text('[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/dpo"\n[train]\ninit_from = "sft"\n')
    smoke = tmp_path / "smoke.toml"
    smoke.write_text(derived_config(source, tmp_path / "outputs" / "dpo" / "smoke", {}))
    run, copy = (config.load(path, env=hpl_env) for path in (source, smoke))
    assert copy.paths.output_dir != run.paths.output_dir
    assert (copy.train.init_from, copy.paths.model_dir) == (run.train.init_from, run.paths.model_dir)


def test_the_download_step_reads_the_init_runs_model_and_never_writes_it(tmp_path, hpl_env, tiny_models_dir, capsys):
    source = tmp_path / "dpo.toml"
    source.write_text('[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/dpo"\n[train]\ninit_from = "sft"\n')
    cfg = config.load(source, env=hpl_env)
    with pytest.raises(StepError, match=r"^train.init_from: .*/sft/merged lacks the folder: that run's merge step"):
        download.download(cfg, endpoint="http://127.0.0.1:9")  # no Hub call: the model is never fetched
    shutil.copytree(tiny_models_dir / "tiny-llama", cfg.paths.model_dir)
    (tmp_path / "outputs" / "sft" / "merged" / "config.json").unlink()
    with pytest.raises(StepError, match=r"lacks config.json"):
        download.download(cfg)
    shutil.copy(tiny_models_dir / "tiny-llama" / "config.json", cfg.paths.model_dir)
    assert str(download.download(cfg)) == cfg.paths.model_dir
    assert "is train.init_from's merged model; nothing to download" in capsys.readouterr().out


def test_the_gpu_examples_dry_run_shows_where_its_init_run_stands(tmp_path, tiny_models_dir, monkeypatch, capsys):
    from payload_configs import CONFIGS

    from llm_pipeline import submit

    monkeypatch.setenv("HPL_OUTPUTS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no Slurm: the init run has no chain to find
    example = ["--config", str(CONFIGS / "llama3-8b-dpo-g6e.toml"), "--dry-run"]
    sft = tmp_path / "llama3-8b-lora-g6e"
    said = {}
    for stage in ("no run", "no merged model", "finished"):
        if stage == "no merged model":
            (sft / "logs").mkdir(parents=True)
        if stage == "finished":
            shutil.copytree(tiny_models_dir / "tiny-llama", sft / "merged")
        assert submit.main(example) == 0
        said[stage] = capsys.readouterr().out
        assert "prepare_job=$(sbatch" in said[stage] and "after_job" not in said[stage]
    assert said["no run"].startswith(f"# at submit: train.init_from: no run llama3-8b-lora-g6e in {tmp_path}: ")
    assert said["no merged model"].startswith(
        f"# at submit: train.init_from: run {sft} has no merged model (lacks merged/) and no merge job queued or "
        "running"
    )
    assert said["finished"].startswith("# dry run: nothing submitted.")
