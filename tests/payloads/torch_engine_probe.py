"""Train with the torch engine (one process, or one rank of a torchrun launch) and write what the
precision tests check as JSON, per run config (by file stem): the logged losses, the dtype of every
loss the trainer computed, the share of trainable weights that changed, how many packed 4-bit words
changed, and the parameter dtypes the engine reported. Run by engine_launch.run_engine on the main stack.

    python torch_engine_probe.py --config lora.toml --config full.toml --out result.json [--liger-standin]

Several configs train one after another in the same processes (one launch, one process group).
With --liger-standin, liger-kernel's Triton launches run as torch references (liger_standin.py) and the
engine's two CUDA decisions about liger (the lever check, "auto") answer as on a CUDA host.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import liger_standin
import torch

from llm_pipeline import config, data
from llm_pipeline.training import device, parts
from llm_pipeline.training.plan import TrainPlan
from llm_pipeline.training.torch import backend, methods


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of a (maybe FSDP2-sharded) parameter, on the CPU."""
    tensor = tensor.detach()
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).cpu().clone()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw words (NaN-patterned packed words compare by bits, not by value)."""
    return tensor.view(torch.int16) if tensor.element_size() == 2 else tensor.view(torch.int32)


def named_parameters(model) -> dict[str, torch.Tensor]:
    """Parameters by their name in the loaded model (FSDP's activation checkpointing wraps layers)."""
    return {name.replace("_checkpoint_wrapped_module.", ""): p for name, p in model.named_parameters()}


def train_and_measure(run_config: Path) -> dict:
    """One training run of ``run_config`` and what it changed."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # a fresh accelerator per run; the process group stays
    cfg = config.load(run_config)
    plan = TrainPlan(
        backend="torch",
        max_steps=cfg.train.max_steps,
        logging_steps=cfg.train.logging_steps,
        save_checkpoints=False,
        resume_from=None,
        start_step=0,
        tensorboard_dir=None,
    )
    liger_standin.CALLS.clear()
    data.prepare_if_stale(cfg)
    datasets, tokenizer = data.training_inputs(cfg)
    trainer, _ = backend.build_trainer(cfg, parts.read(cfg), plan, datasets, tokenizer)
    parameters = named_parameters(trainer.model)
    packed = {name for name, p in parameters.items() if p.__class__.__name__ == "Params4bit"}
    trainable = {name for name, p in parameters.items() if p.requires_grad}
    before = {name: whole(parameters[name]) for name in sorted(packed | trainable)}

    loss_dtypes: set[str] = set()
    compute_loss = trainer.compute_loss

    def recording_compute_loss(*a, **kw):
        result = compute_loss(*a, **kw)
        loss = result[0] if isinstance(result, tuple) else result
        loss_dtypes.add(str(loss.dtype).removeprefix("torch."))
        return result

    trainer.compute_loss = recording_compute_loss
    trainer.train()

    after_parameters = named_parameters(trainer.model)
    after = {name: whole(after_parameters[name]) for name in sorted(packed | trainable)}
    changed = sum(int((after[n] != before[n]).sum()) for n in trainable)
    return {
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "loss_dtypes": sorted(loss_dtypes),
        "trainable_dtypes": sorted({str(after[n].dtype).removeprefix("torch.") for n in trainable}),
        "changed_fraction": changed / sum(after[n].numel() for n in trainable),
        "packed_words": sum(after[n].numel() for n in packed),
        "packed_words_changed": sum(int((bits(after[n]) != bits(before[n])).sum()) for n in packed),
        "parameter_dtypes": trainer.parameter_dtypes,
        "liger_calls": dict(liger_standin.CALLS),
        "trl_liger_switch": trainer.args.use_liger_kernel,  # deprecated in trl 1.16: the engine applies liger
    }


def act_as_cuda_for_liger() -> None:
    """liger's Python path on this CPU: its kernels as torch references, and the engine told CUDA is there
    for liger alone (the lever check and train.liger_kernel = "auto")."""
    liger_standin.install()
    check_lever_packages, liger_enabled = backend.check_lever_packages, methods.liger_enabled
    backend.check_lever_packages = lambda cfg, kind=None: check_lever_packages(cfg, kind=device.CUDA)
    methods.liger_enabled = lambda part, cuda=None, liger_installed=None: liger_enabled(part, cuda=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", action="append", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--liger-standin", action="store_true")
    args = parser.parse_args()
    if args.liger_standin:
        act_as_cuda_for_liger()
    results = {path.stem: train_and_measure(path) for path in args.config}
    if os.environ.get("RANK", "0") == "0":
        args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    from llm_pipeline.cli import exit_step  # FSDP2 keeps gloo's workers alive: see its docstring

    main()
    exit_step(0)
