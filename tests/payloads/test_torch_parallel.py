"""What a GPU run hands accelerate for parallel.strategy fsdp: checked on the plugin accelerate 1.8.1
builds from the Trainer arguments and the environment (the CUDA path cannot run here; the CPU path
through the same plugin is run by tests/slurm/test_fsdp_train.py)."""

from __future__ import annotations

import os

import pytest
import torch
from payload_configs import tiny_config

from llm_pipeline.training.torch import parallel as torch_parallel


@pytest.fixture(autouse=True)
def restore_environment():
    """SFTConfig(fsdp=...) exports ACCELERATE_USE_FSDP and FSDP_* for the process: undo it for later tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def fsdp_plugin(cfg, monkeypatch, world_size: int):
    """The plugin accelerate builds for a GPU launch: SFTConfig sets FSDP_* variables, we add ours."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl import SFTConfig

    env = {}
    torch_parallel.set_fsdp_environment(cfg, world_size, env)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = SFTConfig(output_dir="unused", use_cpu=True, **torch_parallel.trainer_arguments(cfg, world_size))
    plugin = FullyShardedDataParallelPlugin()
    plugin.activation_checkpointing = args.fsdp_config["activation_checkpointing"]  # as the Trainer copies it
    return plugin, args


def test_fsdp_is_full_shard_fsdp2_per_decoder_layer_with_sharded_checkpoints(hpl_env, monkeypatch):
    from torch.distributed.fsdp import StateDictType

    plugin, args = fsdp_plugin(tiny_config(hpl_env), monkeypatch, world_size=8)
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True  # full shard: parameters freed after each forward
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT  # each rank writes its shard
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing and not args.gradient_checkpointing  # FSDP's own, not both
    plugin.set_mixed_precision("bf16")  # what accelerate does when train.bf16 is on
    policy = plugin.mixed_precision_policy
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.bfloat16


@pytest.mark.parametrize(("strategy", "world_size"), [("ddp", 8), ("fsdp", 1)])
def test_ddp_and_single_process_use_non_reentrant_checkpointing_and_no_fsdp(hpl_env, strategy, world_size):
    cfg = tiny_config(hpl_env, parallel={"strategy": strategy})
    env: dict[str, str] = {}
    torch_parallel.set_fsdp_environment(cfg, world_size, env)
    arguments = torch_parallel.trainer_arguments(cfg, world_size)
    assert env == {} and "fsdp" not in arguments
    assert arguments["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
