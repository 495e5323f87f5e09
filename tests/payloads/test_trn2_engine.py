"""The torch engine on Trainium2's native `neuron` device, decided offline: a stand-in accelerator
(torch's accelerator API reporting a `neuron` device, just enough for the decision functions)
stands for TorchNeuron; the libraries' own neuron branches are pinned by test_trn2_contract.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from payload_configs import tiny_config, write_config

from llm_pipeline import sagemaker_job, train
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import partitions
from llm_pipeline.training import backends, device
from llm_pipeline.training.parts import model_part
from llm_pipeline.training.torch import backend as torch_backend
from llm_pipeline.training.torch import methods as torch_methods


@pytest.fixture
def neuron_accelerator(monkeypatch):
    """torch.accelerator reports a `neuron` device, as torch-neuronx's native runtime makes it."""
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *_, **__: SimpleNamespace(type="neuron"))


def test_the_engine_takes_the_neuron_device_instead_of_the_cpu(neuron_accelerator):
    kind = device.accelerator_type()
    assert kind == device.NEURON
    assert "use_cpu" not in device.trainer_device_arguments(kind)
    assert device.trainer_device_arguments(device.CPU) == {"use_cpu": True}


def test_without_an_accelerator_the_engine_says_cpu():
    assert device.accelerator_type() == device.CPU  # this machine: the CPU wheel of torch


def test_auto_picks_the_torch_engine_and_the_neuron_engine_names_the_lane(neuron_accelerator):
    assert backends.resolve_backend("auto") == "torch"
    assert backends.resolve_backend("torch") == "torch"
    with pytest.raises(StepError, match=r"train.backend = 'neuron'.*set train.backend = 'torch' or 'auto'"):
        backends.resolve_backend("neuron")
    assert backends.resolve_backend("neuron", kind=device.CPU) == "neuron"  # trn1's lane is unchanged


def test_auto_attention_is_sdpa_on_neuron(hpl_env, neuron_accelerator):
    part = model_part(tiny_config(hpl_env, train={"attention": "auto", "liger_kernel": "auto"}))
    assert torch_methods.attention_kernel(part, flash_installed=True) == "sdpa"
    assert not torch_methods.liger_enabled(part, liger_installed=True)


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"train": {"liger_kernel": True}}, "train.liger_kernel = True"),
        ({"train": {"attention": "flash_attention_2"}}, "train.attention = 'flash_attention_2'"),
        ({"train": {"method": "qlora"}}, "train.method = 'qlora'"),
        ({"data": {"packing": True}}, "data.packing = True"),
    ],
)
def test_cuda_levers_are_refused_on_neuron_naming_the_key(hpl_env, tmp_path, capsys, neuron_accelerator, sections, key):
    run = {"max_steps": 2, "save_steps": 2, "logging_steps": 1}
    sections = {**sections, "train": {**run, **sections.get("train", {})}}
    path = write_config(tmp_path / "run.toml", hpl_env, **sections)
    assert train.main(["--prepare-data", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{key} cannot run on the neuron device (TorchNeuron)" in err
    assert not tiny_config(hpl_env, **sections).paths.checkpoints_dir.exists()


def test_the_same_levers_pass_on_the_cpu(hpl_env):
    cfg = tiny_config(hpl_env, data={"packing": True})
    torch_backend.check_lever_packages(cfg, kind=device.CPU)  # no refusal: packing is fine off Neuron


def test_one_refusal_table_answers_for_every_device(hpl_env):
    cfg = tiny_config(hpl_env, train={"liger_kernel": True})
    cuda_only = "train.liger_kernel = True needs a CUDA GPU and this runtime has none: liger-kernel's kernels"
    assert device.refused_levers(cfg, device.CUDA) == []
    (cpu,) = device.refused_levers(cfg, device.CPU)
    assert cpu.startswith(cuda_only)
    neuron = device.refused_levers(cfg, device.NEURON)  # the device's own line first, then the CUDA-only one
    assert neuron[0].startswith("train.liger_kernel = True cannot run on the neuron device") and neuron[-1] == cpu
    with pytest.raises(StepError, match=re.escape(cuda_only)):
        torch_backend.check_lever_packages(cfg, kind=device.CPU)


def test_neuron_batches_keep_one_shape(hpl_env):
    """trl's collator with the engine's neuron arguments: rows of any length come out data.max_length long."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    max_length = tiny_config(hpl_env).data.max_length
    arguments = device.shape_arguments(max_length, device.NEURON)
    assert arguments["dataloader_drop_last"] is True  # a short last batch would be one more shape
    collator = DataCollatorForLanguageModeling(pad_token_id=0, pad_to_multiple_of=arguments["pad_to_multiple_of"])
    shapes = {
        tuple(collator([{"input_ids": list(range(1, length + 1))} for length in lengths])["input_ids"].shape)
        for lengths in ([3, 5], [max_length, 7], [1, 2])
    }
    assert shapes == {(2, max_length)}
    assert device.shape_arguments(max_length, device.CPU) == {}  # elsewhere: pad to the batch's longest row


def test_precompile_on_trainium2_runs_without_the_xla_tool(monkeypatch, tmp_path):
    monkeypatch.setattr(sagemaker_job, "neuron_devices", lambda: True)
    hosts = SimpleNamespace(hosts=["algo-1"])
    env = {"HPL_DEVICES_PER_NODE": "64", "SM_CURRENT_HOST": "algo-1", "SM_HOSTS": '["algo-1"]'}
    run = tmp_path / "run.toml"
    native = sagemaker_job.step_command("precompile", run, {**env, "HPL_IMAGE_FAMILY": "torchneuron"}, hosts)
    xla = sagemaker_job.step_command("precompile", run, {**env, "HPL_IMAGE_FAMILY": "neuron"}, hosts)
    assert "neuron_parallel_compile" not in native and native[-1] == "--precompile"
    assert xla[0] == "neuron_parallel_compile"


def test_partition_facts_carry_the_image_family_and_the_mfu_peak():
    trn2 = {"accelerator": "neuron", "devices_per_node": 64, "efa_interfaces": 16, "efa_device_rdma": 1}
    env = partitions.partition_environment("trn2", {**trn2, "image_family": "torchneuron", "peak_tflops": 166.75})
    assert env["HPL_IMAGE_FAMILY"] == "torchneuron" and env["HPL_PEAK_TFLOPS"] == "166.75"
    older = partitions.partition_environment("trn1", {**trn2, "devices_per_node": 32})  # a deploy before trn2
    assert older["HPL_IMAGE_FAMILY"] == "neuron" and "HPL_PEAK_TFLOPS" not in older
    assert "HPL_HOST_MEMORY_GIB" not in older  # prepare then says the load was not sized
    sized = partitions.partition_environment("trn2", {**trn2, "host_memory_gib": 2048})
    assert sized["HPL_HOST_MEMORY_GIB"] == "2048"
