"""What a GPU run hands accelerate for parallel.strategy fsdp: checked on the plugin accelerate 1.8.1
builds from the Trainer arguments and the environment (the CUDA path cannot run here; the CPU path
through the same plugin is run by tests/slurm/test_fsdp_train.py)."""

from __future__ import annotations

import os

import pytest
import torch
from payload_configs import tiny_config

from llm_pipeline.training.parts import model_part
from llm_pipeline.training.torch import parallel as torch_parallel


@pytest.fixture(autouse=True)
def restore_environment():
    """SFTConfig(fsdp=...) exports ACCELERATE_USE_FSDP and FSDP_* for the process: undo it for later tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def fsdp_plugin(cfg, monkeypatch, world_size: int):
    """The plugin a GPU launch gets: transformers' Trainer builds it from the arguments' fsdp_plugin_args
    (create_accelerator_and_postprocess), with no FSDP_* variable set."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl import SFTConfig

    for key in [key for key in os.environ if key.startswith("FSDP_")]:
        monkeypatch.delenv(key)
    args = SFTConfig(output_dir="unused", use_cpu=True, **torch_parallel.trainer_arguments(cfg, world_size))
    return FullyShardedDataParallelPlugin(**args.fsdp_plugin_args), args


def test_fsdp_is_full_shard_fsdp2_per_decoder_layer_with_sharded_checkpoints(hpl_env, monkeypatch):
    from torch.distributed.fsdp import StateDictType

    cfg = tiny_config(hpl_env, train={"gradient_checkpointing": True})
    plugin, args = fsdp_plugin(cfg, monkeypatch, world_size=8)
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True  # full shard: parameters freed after each forward
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT  # each rank writes its shard
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing and not args.gradient_checkpointing  # FSDP's own, not both
    # train.bf16 (the default): gather and compute in bf16, reduce gradients and return the loss in fp32
    # (accelerate's own bf16 policy, which the engine replaces, reduces and returns bf16)
    policy = torch_parallel.mixed_precision_policy(model_part(tiny_config(hpl_env, train={"bf16": True})))
    assert policy.param_dtype == torch.bfloat16
    assert policy.reduce_dtype == torch.float32 and policy.output_dtype == torch.float32
    assert torch_parallel.mixed_precision_policy(model_part(tiny_config(hpl_env, train={"bf16": False}))) is None
    # qlora computes in bf16 whatever train.bf16 says
    qlora = tiny_config(hpl_env, train={"bf16": False, "method": "qlora"})
    assert torch_parallel.mixed_precision_policy(model_part(qlora)).param_dtype == torch.bfloat16


@pytest.mark.parametrize(("strategy", "world_size"), [("ddp", 8), ("fsdp", 1)])
def test_ddp_and_single_process_use_non_reentrant_checkpointing_and_no_fsdp(hpl_env, strategy, world_size):
    cfg = tiny_config(hpl_env, parallel={"strategy": strategy}, train={"gradient_checkpointing": True})
    arguments = torch_parallel.trainer_arguments(cfg, world_size)
    assert "fsdp" not in arguments and "fsdp_config" not in arguments
    assert arguments["activation_checkpointing"] is True
    assert arguments["activation_checkpointing_kwargs"] == {"use_reentrant": False}


@pytest.mark.parametrize(("strategy", "world_size"), [("fsdp", 8), ("ddp", 8), ("fsdp", 1)])
def test_gradient_checkpointing_off_reaches_every_strategy(hpl_env, strategy, world_size):
    """The key is honoured: trl's SFTConfig would turn the Trainer's checkpointing on by itself."""
    from trl import SFTConfig

    cfg = tiny_config(hpl_env, parallel={"strategy": strategy}, train={"gradient_checkpointing": False})
    arguments = torch_parallel.trainer_arguments(cfg, world_size)
    args = SFTConfig(output_dir="unused", use_cpu=True, **arguments)
    # transformers 5 renamed the switch; the old name mirrors the new one (what trl's default set)
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    assert not (args.fsdp_config or {}).get("activation_checkpointing", False)


@pytest.mark.parametrize(("method", "default"), [("full", True), ("lora", False), ("qlora", False), ("dora", False)])
def test_gradient_checkpointing_defaults_on_only_for_full_fine_tuning(hpl_env, method, default):
    assert tiny_config(hpl_env, train={"method": method}).train.gradient_checkpointing is default
    # a value in the file wins
    assert tiny_config(
        hpl_env, train={"method": method, "gradient_checkpointing": not default}
    ).train.gradient_checkpointing is (not default)


def test_qlora_under_fsdp2_needs_an_accelerate_that_keeps_the_4bit_base(hpl_env):
    from llm_pipeline.errors import StepError

    qlora = tiny_config(hpl_env, train={"method": "qlora"})
    with pytest.raises(StepError, match=r"accelerate 1\.8\.1 casts the packed 4-bit base to fp32 under FSDP2"):
        torch_parallel.check_accelerate_keeps_4bit(qlora, 2, version="1.8.1")
    torch_parallel.check_accelerate_keeps_4bit(qlora, 2, version="1.14.0")
    torch_parallel.check_accelerate_keeps_4bit(qlora, 1, version="1.8.1")  # one process: nothing is sharded
    torch_parallel.check_accelerate_keeps_4bit(tiny_config(hpl_env), 2, version="1.8.1")  # lora: no 4-bit base


def test_a_finished_run_leaves_its_process_group(tmp_path):
    """The engine tears the group down itself (left to interpreter exit, gloo's threads can abort a finished rank)."""
    import torch.distributed as dist

    from llm_pipeline.training.torch.backend import leave_process_group

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert dist.is_initialized()
    leave_process_group()
    assert not dist.is_initialized()
    leave_process_group()  # one process, never initialised: nothing to do
