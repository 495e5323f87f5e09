"""What the trn2 lane relies on in the installed accelerate, transformers and trl: their `neuron` device
branches (torch-neuronx's native runtime), read from the sources since no Neuron device is here."""

from __future__ import annotations

import inspect

import accelerate.state
import transformers.training_args
from accelerate.utils import DistributedType
from accelerate.utils import imports as accelerate_imports
from transformers.utils import import_utils
from trl import SFTConfig


def source(function) -> str:
    return inspect.getsource(function)


def test_accelerate_knows_the_neuron_distributed_type_and_process_group():
    assert DistributedType.MULTI_NEURON.value == "MULTI_NEURON"
    backend = source(accelerate.state.PartialState._prepare_backend)
    assert 'backend = "neuron"' in backend and "DistributedType.MULTI_NEURON" in backend
    # torch-xla wins over the native device: the trn2 image must not carry torch_xla (verify_env checks it)
    assert backend.index("is_torch_xla_available()") < backend.index("is_neuron_available()")


def test_accelerate_picks_the_neuron_device_where_torch_neuronx_is_installed():
    assert 'torch.device("neuron")' in source(accelerate.state.PartialState.default_device.fget)
    assert 'find_spec("torch_neuronx")' in source(accelerate_imports.is_neuron_available)


def test_accelerate_turns_fsdp_on_for_a_neuron_launch():
    """FSDP2 through accelerate's plugin: MULTI_NEURON is among the types the FSDP plugin applies to."""
    init = source(accelerate.state.AcceleratorState.__init__)
    fsdp_types = init[init.index("DistributedType.MULTI_GPU,", init.index("elif self.distributed_type in")) :]
    assert "DistributedType.MULTI_NEURON" in fsdp_types[: fsdp_types.index("]")]
    assert "self.distributed_type = DistributedType.FSDP" in init


def test_trainingarguments_trains_on_neuron_unless_told_use_cpu():
    setup = source(transformers.training_args.TrainingArguments._setup_devices.func)
    assert "is_torch_neuron_available()" in setup and 'torch.device("neuron:0")' in setup
    assert setup.index("self.use_cpu") < setup.index("is_torch_neuron_available()")  # use_cpu would win
    # the torch-xla era's branch (optimum-neuron's trainer) needs torch_xla, which the trn2 image lacks
    assert "is_torch_xla_available()" in source(import_utils.is_torch_neuroncore_available)


def test_torch_compile_on_neuron_uses_the_neuron_backend():
    post_init = source(transformers.training_args.TrainingArguments.__post_init__)
    assert 'self.torch_compile_backend = "neuron"' in post_init


def test_trl_pads_neuron_batches_when_asked_and_by_default():
    post_init = source(SFTConfig.__post_init__)
    assert 'self.device.type == "neuron"' in post_init  # auto: 128 on neuron; the engine passes max_length
    assert "pad_to_multiple_of" in {field for field in SFTConfig.__dataclass_fields__}
