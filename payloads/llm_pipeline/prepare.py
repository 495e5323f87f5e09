"""Prepare step check: in the runtime every step uses, the run config validates and the training
stack imports, so a bad config or a broken image fails in seconds, not after the download.

    python -m llm_pipeline.prepare --config run.toml
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import platform
import sys

from llm_pipeline import config
from llm_pipeline.train import resolve_backend

STACK = ("torch", "transformers", "peft", "trl", "datasets", "safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_pipeline.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="run config (TOML)")
    args = parser.parse_args(argv)
    try:
        cfg = config.load(args.config)
        backend = resolve_backend(cfg.train.backend)
        config.check_backend(cfg, backend)  # train.method etc. against the backend this runtime picks
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run config ok: model {cfg.model.id}, run folder {cfg.paths.output_dir}")
    print(f"backend {backend}: method {cfg.train.method}, strategy {cfg.parallel.strategy}")
    print(f"python {platform.python_version()} at {sys.executable}")
    for name in STACK:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            print(
                f"error: {name} does not import in this runtime ({exc}): rebuild the image or the environment",
                file=sys.stderr,
            )
            return 2
        print(f"  {name} {getattr(module, '__version__', '?')}")
    neuron = importlib.util.find_spec("torch_xla") is not None
    print(f"neuron backend available: {'yes' if neuron else 'no (torch backend)'}")
    if backend == "neuron" and check_neuron(cfg):
        return 2
    return check_full_storage(cfg)


def check_neuron(cfg: config.RunConfig) -> int:
    """optimum-neuron's rules for this run (packing, fused q/k/v), with the model's config when downloaded."""
    from llm_pipeline.errors import StepError
    from llm_pipeline.training.neuron_rules import check_neuron_run, read_model_config

    config_file = f"{cfg.paths.model_dir}/config.json"
    try:
        model_config = read_model_config(cfg.paths.model_dir)
        check_neuron_run(cfg, model_config, config_file)
    except StepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if model_config is None:
        print(f"note: {config_file} is not there yet; the train step checks the layout against it")
    return 0


def check_full_storage(cfg: config.RunConfig) -> int:
    """Full fine-tuning: do train.save_total_limit checkpoints and the model fit where the run writes?
    (Once the model is downloaded; the train step checks again before training.)"""
    from llm_pipeline.errors import StepError
    from llm_pipeline.training.full_rules import check_storage
    from llm_pipeline.training.neuron_rules import read_model_config

    if cfg.train.method != "full":
        return 0
    try:
        model_config = read_model_config(cfg.paths.model_dir)
        if model_config is None:
            print("note: the model is not downloaded yet; the train step checks the storage for checkpoints")
            return 0
        print(f"storage: {check_storage(cfg, model_config)}")
    except StepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
