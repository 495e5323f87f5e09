"""`parallel.strategy` on the torch backend: FSDP2 through accelerate, or DDP; one process per device.

FSDP2 (accelerate's ``fsdp_version=2``): every decoder layer and then the root is ``fully_shard``-ed
(parameters, gradients and optimizer state split across all ranks); with ``train.gradient_checkpointing``
activations are recomputed per decoder layer; with ``train.bf16`` parameters are gathered in bf16
while gradients are reduced and the loss and logits returned in fp32 (``mixed_precision_policy``;
accelerate's own bf16 policy reduces and returns bf16) and the trainable shards stay fp32 master
weights (methods.apply_precision); checkpoints are torch distributed checkpoints (each rank writes
its shard). transformers 5's Trainer builds accelerate's FSDP plugin from ``fsdp_config`` alone
(``TrainingArguments.fsdp_plugin_args``; 4.x passed it through ``FSDP_*`` environment variables), so
every setting lives in the arguments ``trainer_arguments`` returns.

accelerate turns FSDP on only for accelerator devices (CUDA and the like); with the CPU wheel and
gloo it would silently fall back to DDP. ``enable_fsdp_on_cpu`` switches the same accelerate FSDP2
code path on for CPU processes, so the CPU tests run what a GPU run runs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.training.parts import ModelPart
from llm_pipeline.training.torch.methods import computes_in_bf16

DECODER_LAYER = "LlamaDecoderLayer"
SHARDED_OPTIMIZER_DIR = "optimizer_0"  # accelerate's name for the first optimizer's distributed checkpoint
# accelerate 1.8.1 casts the whole model to fp32 after fully_shard, packed 4-bit storage included, so the
# bf16 all-gather then rewrites packed words that read as NaN; 1.14 leaves a 4-bit model as loaded.
ACCELERATE_KEEPS_4BIT = (1, 14)


def uses_fsdp(cfg: RunConfig, world_size: int) -> bool:
    """FSDP needs more than one process; one process trains the plain model."""
    return cfg.parallel.strategy == "fsdp" and world_size > 1


def loads_once(cfg: RunConfig, world_size: int) -> bool:
    """Full fine-tuning under FSDP reads the fp32 weights on rank 0 only: the other ranks allocate the
    model without reading it (methods.empty_model) and accelerate's FSDP2 preparation
    (cpu_ram_efficient_loading) broadcasts each rank its shards. 64 whole copies would fill a
    trn2.48xlarge's host memory (training.full_rules.check_host_memory). transformers 5.24's
    from_pretrained does not skip the weights on the other ranks by itself (its FSDP branch only fixes
    buffers), so the engine builds those ranks' models itself."""
    return uses_fsdp(cfg, world_size) and cfg.train.method == "full"


def builds_empty(cfg: RunConfig, world_size: int, rank: int) -> bool:
    """This rank builds the model without weights: it receives them from rank 0 (``loads_once``)."""
    return loads_once(cfg, world_size) and rank != 0


def trainer_arguments(cfg: RunConfig, world_size: int, layer_class: str = DECODER_LAYER) -> dict[str, Any]:
    """SFTConfig keyword arguments for the strategy and train.gradient_checkpointing (transformers 5 names it
    activation_checkpointing; its gradient_checkpointing is a deprecated alias that mirrors it)."""
    recompute = cfg.train.gradient_checkpointing
    if not uses_fsdp(cfg, world_size):
        # trl's SFTConfig turns checkpointing on unless told; its default reentrant form breaks DDP with
        # peft ("marked a variable ready only once"), so use the non-reentrant form.
        kwargs = {"activation_checkpointing_kwargs": {"use_reentrant": False}} if recompute else {}
        return {"activation_checkpointing": recompute, **kwargs}
    return {
        "fsdp": "full_shard auto_wrap",
        "fsdp_config": {
            "version": 2,
            "reshard_after_forward": True,  # full shard: parameters freed after each forward
            "state_dict_type": "SHARDED_STATE_DICT",  # each rank writes its own shard
            "transformer_layer_cls_to_wrap": [layer_class],
            "activation_checkpointing": recompute,  # FSDP's own, per wrapped layer (not the Trainer's)
            "cpu_ram_efficient_loading": loads_once(cfg, world_size),
        },
        "activation_checkpointing": False,  # the Trainer's own would recompute a second time
    }


def mixed_precision_policy(part: ModelPart):
    """FSDP2's policy: bf16 all-gather and compute, fp32 gradient reduction and outputs (None: all fp32)."""
    if not computes_in_bf16(part):
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)


def check_accelerate_keeps_4bit(cfg: RunConfig, world_size: int, version: str | None = None) -> None:
    """qlora under FSDP2 needs an accelerate that does not upcast the packed 4-bit base."""
    if cfg.train.method != "qlora" or not uses_fsdp(cfg, world_size):
        return
    if version is None:
        from importlib.metadata import version as installed

        version = installed("accelerate")
    if tuple(int(part) for part in version.split(".")[:2]) < ACCELERATE_KEEPS_4BIT:
        raise StepError(
            f"train.method qlora with parallel.strategy fsdp: accelerate {version} casts the packed 4-bit base to "
            f"fp32 under FSDP2 and corrupts it; run with accelerate >= "
            f"{'.'.join(map(str, ACCELERATE_KEEPS_4BIT))} (the CUDA image's pin, payloads/requirements-gpu.txt) "
            'or set parallel.strategy = "ddp"'
        )


def apply_mixed_precision_policy(trainer, part: ModelPart) -> None:
    """Replace accelerate's FSDP2 policy (bf16 reduce and outputs) with ours, before the model is sharded."""
    trainer.accelerator.state.fsdp_plugin.mixed_precision_policy = mixed_precision_policy(part)


def enable_fsdp_on_cpu(trainer) -> None:
    """Give a CPU (gloo) run accelerate's FSDP2 path; a no-op where accelerate enabled it already."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type == DistributedType.FSDP:
        return
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(f"parallel.strategy fsdp: accelerate chose {state.distributed_type}, expected FSDP")
    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)  # as the Trainer builds it on GPU
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


def load_sharded_optimizer(trainer, checkpoint: Path) -> None:
    """Load the FSDP2 optimizer state of ``checkpoint`` (accelerate's own loader misses it), reading only
    the files this host holds.

    accelerate 1.8.1 loads the sharded optimizer checkpoint into ``optimizer.state_dict()``, whose
    keys are parameter numbers and whose state is still empty before the first step, so nothing is
    read and a resumed run restarts Adam's moments. The template from ``get_optimizer_state_dict``
    has the parameter names and initialised state the checkpoint was written with.

    Each rank's moments are its own shards, in its own ``__<rank>_0.distcp``. The replicated entries
    (``param_groups`` and every parameter's ``step``) are written once, by whichever rank torch's
    save planner picked (it balances them over the ranks: mostly the others' files, not rank 0's),
    and every rank reads them. A training job's hosts share no disk: each rank reads what its host
    holds (HostFilesPlanner) and gets the other replicated entries from the rank that wrote them.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    folder = Path(checkpoint) / SHARDED_OPTIMIZER_DIR
    if not folder.is_dir():
        raise StepError(f"{folder} is missing: the checkpoint has no sharded optimizer state to resume from")
    state = {"optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer)}
    planner = host_files_planner(folder)
    dcp.load(state, checkpoint_id=str(folder), planner=planner)
    for writer in sorted(set(planner.writers.values())):  # the same order on every rank: the same collectives
        names = [name for name, rank in planner.writers.items() if rank == writer]
        box = [{name: planner.entry(name) for name in names} if dist.get_rank() == writer else None]
        dist.broadcast_object_list(box, src=writer)
        for name, value in box[0].items():
            planner.set_entry(name, value)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optimizer"])


DCP_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # torch's FileSystemWriter: __<rank>_<n>.distcp


def host_files_planner(folder: Path):
    """A DefaultLoadPlanner that reads only the entries whose file is in ``folder`` on this host and notes,
    for every replicated entry (anything but a DTensor shard), the rank whose file holds it (``writers``).
    A shard of this rank's own parameters in a file this host lacks stops the load, naming the file."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.tensor import DTensor

    class HostFilesPlanner(DefaultLoadPlanner):
        def __init__(self):
            super().__init__()
            self.writers: dict[str, int] = {}

        def create_local_plan(self):
            plan = super().create_local_plan()
            here = []
            for item in plan.items:
                name = item.dest_index.fqn
                path = self.metadata.storage_data[item.storage_index].relative_path
                if not isinstance(self.state_dict[name], DTensor):
                    self.writers[name] = int(DCP_FILE.match(path).group(1))
                if (folder / path).is_file():
                    here.append(item)
                elif name not in self.writers:
                    raise StepError(
                        f"cannot resume: {folder / path} is missing and holds this rank's shard of {name}; a "
                        "sharded checkpoint resumes on as many processes as wrote it, each host holding its own files"
                    )
            return dataclasses.replace(plan, items=here)

        def entry(self, name: str):
            return _element(self.original_state_dict, self.mappings[name])

        def set_entry(self, name: str, value) -> None:
            *parents, last = self.mappings[name]
            target = _element(self.original_state_dict, parents)
            if hasattr(target[last], "copy_"):
                target[last].copy_(value)
            else:
                target[last] = value

    return HostFilesPlanner()


def _element(nested, path):
    for key in path:
        nested = nested[key]
    return nested
