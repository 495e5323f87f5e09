"""Prepare step check: in the runtime every step uses, the run config validates and the training
stack imports, so a bad config or a broken image fails in seconds, not after the download.

    python -m llm_pipeline.prepare --config run.toml [--ladder]   (--ladder: the pretraining ladder's storage too)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

from llm_pipeline import cli, config
from llm_pipeline.errors import StepError
from llm_pipeline.training.backends import resolve_backend

STACK = ("torch", "transformers", "peft", "trl", "datasets", "safetensors")
NODE_DEVICES = "HPL_DEVICES_PER_NODE"  # the node's accelerator count, from the cluster facts
NODE_MEMORY = "HPL_HOST_MEMORY_GIB"  # the node's host memory (stacks/accelerators.py, through the partition)


def check_processes_per_node(cfg: config.RunConfig, env: Mapping[str, str]) -> None:
    """parallel.devices_per_node must equal the node's devices, the processes launch starts per node."""
    wanted = cfg.parallel.devices_per_node
    node = env.get(NODE_DEVICES, "")
    if not node:
        print(f"processes per node: {wanted} (parallel.devices_per_node; {NODE_DEVICES} is not set here)")
        return
    if not node.isdigit() or int(node) != wanted:
        raise StepError(
            f"parallel.devices_per_node is {wanted} but this node has {NODE_DEVICES}={node} devices "
            f"(cluster facts): set parallel.devices_per_node = {node} in the run config, or submit to a "
            "partition whose nodes have that many devices"
        )
    print(f"processes per node: {wanted} (parallel.devices_per_node, equals {NODE_DEVICES})")


def check(cfg: config.RunConfig, env: Mapping[str, str]) -> None:
    backend = resolve_backend(cfg.train.backend)
    config.check_backend(cfg, backend)  # train.method etc. against the backend this runtime picks
    print(f"run config ok: model {cfg.model.id}, run folder {cfg.paths.output_dir}")
    print(f"backend {backend}: method {cfg.train.method}, strategy {cfg.parallel.strategy}")
    check_processes_per_node(cfg, env)
    print(f"python {platform.python_version()} at {sys.executable}")
    for name in STACK:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise StepError(
                f"{name} does not import in this runtime ({exc}): rebuild the image or the environment"
            ) from None
        print(f"  {name} {getattr(module, '__version__', '?')}")
    neuron = importlib.util.find_spec("torch_xla") is not None
    print(f"neuron backend available: {'yes' if neuron else 'no (torch backend)'}")
    if backend == "neuron":
        check_neuron(cfg)
    check_full_storage(cfg, backend)
    check_load_memory(cfg, env, backend)
    check_trainer_names(cfg)
    check_target_modules(cfg)
    check_sources(cfg)


def check_trainer_names(cfg: config.RunConfig) -> None:
    """train.lr_scheduler and train.optimizer against the installed transformers (else train fails on them)."""
    from transformers.training_args import OptimizerNames

    from llm_pipeline.train import check_scheduler

    check_scheduler(cfg.train.lr_scheduler)
    known = [name.value for name in OptimizerNames]
    if cfg.train.optimizer not in known:
        raise StepError(
            f"train.optimizer: {cfg.train.optimizer!r} is not an optimizer of the installed transformers "
            f"(its names include {', '.join(name for name in config.OPTIMIZERS if name in known)})"
        )
    print(f"lr_scheduler {cfg.train.lr_scheduler}, optimizer {cfg.train.optimizer}: known to transformers")


def check_sources(cfg: config.RunConfig) -> None:
    """model.id (unless paths.model_dir holds it already) and a Hub data.dataset can be reached with this
    runtime's token, so the download and data steps do not fail on them later."""
    from llm_pipeline.weights import model_files

    if model_files.is_complete(Path(cfg.paths.model_dir), cfg.model.dtype):
        print(f"model: {cfg.paths.model_dir} holds it already")
    else:
        hub_check("model.id", cfg.model.id, kind="model", revision=cfg.model.revision)
    spec = cfg.data.dataset
    if not Path(spec).expanduser().exists() and not spec.startswith(("/", ".", "~")):  # a Hub id (data.load_source)
        hub_check("data.dataset", spec, kind="dataset")


def hub_check(key: str, repo_id: str, *, kind: str, revision: str | None = None) -> None:
    """The Hub knows ``repo_id`` and lets this runtime's token read it: one error line if not. In offline
    mode (HF_HUB_OFFLINE, a node or rehearsal without Hub access) nothing is asked: a note says so, and
    the download step reads the local cache."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        print(f"note: HF_HUB_OFFLINE is set: {key} {repo_id} not checked on the Hub (download reads the cache)")
        return

    from llm_pipeline.download import find_token

    token = find_token()
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        info = (api.model_info if kind == "model" else api.dataset_info)(repo_id, revision=revision, token=token)
    except GatedRepoError:
        raise StepError(f"{key} {repo_id}: gated, and this token has no access: accept its terms on the Hub") from None
    except RepositoryNotFoundError:
        hint = "" if token else ", or set HF_TOKEN if it is private"
        raise StepError(
            f"{key} {repo_id}: no such {kind} on the Hugging Face Hub (or no access): check {key}{hint}"
        ) from None
    except Exception as exc:
        raise StepError(
            f"{key} {repo_id}: cannot reach the Hugging Face Hub to check it ({str(exc).splitlines()[0]}); "
            f"give the node Hub access, or point {key} at a local copy"
        ) from None
    print(f"{key}: {repo_id} found on the Hub ({kind}{', gated' if getattr(info, 'gated', False) else ''})")


def check_target_modules(cfg: config.RunConfig) -> None:
    """lora.target_modules against the model's modules (built on the meta device: no weights read), once
    the model is downloaded; adapter methods only."""
    from llm_pipeline.training.plan import check_target_modules as check_modules

    if cfg.train.method == "full":
        return
    config_file = Path(cfg.paths.model_dir) / "config.json"
    if not config_file.is_file():
        print(f"note: {config_file} is not there yet; the train step checks lora.target_modules against it")
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.paths.model_dir))
    check_modules(model, cfg.lora)
    print(f"lora.target_modules: all in the model ({', '.join(cfg.lora.target_modules)})")


FROZEN_LANE_NOTE = (
    "note: the trn1 lane (optimum-neuron 0.4.5) is frozen at Neuron SDK 2.26.1: defect fixes only "
    "(docs/versions.md); new Trainium work goes to the trn2 lane (docs/trainium2.md)"
)


def check_neuron(cfg: config.RunConfig) -> None:
    """optimum-neuron's rules for this run (packing, fused q/k/v), with the model's config when downloaded."""
    from llm_pipeline.training.neuron.rules import check_neuron_run
    from llm_pipeline.weights.model_files import read_model_config

    print(FROZEN_LANE_NOTE)
    config_file = f"{cfg.paths.model_dir}/config.json"
    model_config = read_model_config(cfg.paths.model_dir)
    check_neuron_run(cfg, model_config, config_file)
    if model_config is None:
        print(f"note: {config_file} is not there yet; the train step checks the layout against it")


def build_parser():
    parser = cli.parser("prepare", __doc__.split("\n\n")[0])
    parser.add_argument("--ladder", action="store_true", help="the torchtitan ladder's prepare: its storage check too")
    return parser


def run(cfg: config.RunConfig, args) -> None:
    check(cfg, os.environ)
    if args.ladder:
        check_ladder_storage(cfg)


def check_ladder_storage(cfg: config.RunConfig) -> None:
    """The ladder's checkpoints (per rung and at its peak) against the run folder's file system."""
    from llm_pipeline.training.torchtitan import storage

    if importlib.util.find_spec("torchtitan") is None:
        print("storage: torchtitan is not importable here, so the flavor's size is unknown: not checked")
        return
    print(f"storage: {storage.check(cfg)}")


def main(argv: list[str] | None = None) -> int:
    return cli.run_step(build_parser, run, argv)


def check_full_storage(cfg: config.RunConfig, backend: str) -> None:
    """Full fine-tuning: do train.save_total_limit checkpoints and the model fit where the run writes?
    (Once the model is downloaded; the train step checks again before training.)"""
    from llm_pipeline.training.full_rules import check_storage
    from llm_pipeline.weights.model_files import read_model_config

    if cfg.train.method != "full" or not cfg.train.save_checkpoints:
        return
    model_config = read_model_config(cfg.paths.model_dir)
    if model_config is None:
        print("note: the model is not downloaded yet; the train step checks the storage for checkpoints")
        return
    print(f"storage: {check_storage(cfg, model_config, backend=backend)}")


def check_load_memory(cfg: config.RunConfig, env: Mapping[str, str], backend: str) -> None:
    """Full fine-tuning on the torch engine: does a node's load of the model fit its host memory?"""
    from llm_pipeline.training.full_rules import check_host_memory
    from llm_pipeline.training.parts import model_part
    from llm_pipeline.training.torch import methods, parallel
    from llm_pipeline.weights.model_files import read_model_config

    if cfg.train.method != "full" or backend != "torch":
        return
    memory = env.get(NODE_MEMORY, "")
    if not memory:
        print(f"host memory at load: not checked ({NODE_MEMORY} is not set here)")
        return
    model_config = read_model_config(cfg.paths.model_dir)
    if model_config is None:
        print("note: the model is not downloaded yet; its load is not sized against host memory")
        return
    ranks = cfg.parallel.devices_per_node
    once = parallel.loads_once(cfg, ranks * cfg.parallel.nodes)
    load_bytes = methods.load_dtype(model_part(cfg)).itemsize
    print(
        check_host_memory(
            model_config, ranks=ranks, load_bytes=load_bytes, loads_once=once, host_memory_gib=float(memory)
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
