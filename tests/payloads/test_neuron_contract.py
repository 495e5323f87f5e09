"""The neuron backend against the real optimum-neuron 0.4.5 / trl 0.24.0 API, read from their sources.

This machine has no torch_xla, so optimum-neuron's training classes cannot be imported; their
installed sources are parsed instead (api_source), and every class, function, method, attribute and
keyword argument our neuron path uses is taken from our own modules' syntax trees (api_usage).
"""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import api_source
import pytest
from api_usage import check_module
from datasets import Dataset
from payload_configs import neuron_plan, tiny_config

from llm_pipeline.errors import StepError
from llm_pipeline.training import backends, parts
from llm_pipeline.training.neuron import backend as train_neuron
from llm_pipeline.training.plan import sft_arguments
from tools.tiny_model import dolly_records

pytestmark = pytest.mark.trn1

PACKAGE = Path(train_neuron.__file__).parents[2]
NEURON_PATH = ("training.neuron.backend", "training.plan")  # the neuron module and the helpers it spreads into calls


def _usage(name: str):
    return check_module(f"llm_pipeline.{name}", (PACKAGE / (name.replace(".", "/") + ".py")).read_text())


def test_installed_versions_are_the_cluster_pins():
    pins = dict(
        line.split("==")
        for line in (PACKAGE.parent / "requirements-cluster.txt").read_text().splitlines()
        if "==" in line
    )
    for package in ("optimum-neuron", "trl", "peft", "transformers"):
        assert importlib.metadata.version(package) == pins[package], package
    assert pins["optimum-neuron"] == "0.4.5" and pins["trl"] == "0.24.0"


@pytest.mark.parametrize("name", NEURON_PATH)
def test_every_name_and_keyword_we_use_exists(name):
    usage = _usage(name)
    assert usage.problems == []
    assert usage.checked_calls


def test_the_checked_calls_are_the_training_api():
    usage = _usage("training.neuron.backend")
    calls = {call.split("(")[0]: call for call in usage.checked_calls}
    for keyword in ("tensor_parallel_size", "max_length", "disable_sequence_parallel", "skip_cache_push"):
        assert keyword in calls["NeuronSFTConfig"], keyword
    assert calls["NeuronSFTTrainer"] == (
        "NeuronSFTTrainer(args, data_collator, formatting_func, model, peft_config, processing_class, train_dataset)"
    )
    assert (
        calls["NeuronModelForCausalLM.from_pretrained"]
        == "NeuronModelForCausalLM.from_pretrained(attn_implementation, torch_dtype)"
    )
    assert {"NeuronSFTConfig.trn_config", "NeuronSFTTrainer.global_step_last_logged"} <= set(usage.checked_members)
    # The training model class, not the inference class of the same name in optimum.neuron.
    model_class = api_source.resolve("optimum.neuron.models.training", "NeuronModelForCausalLM")
    assert model_class.module == "optimum.neuron.models.training.modeling_auto"


def _source(module: str, cls: str, name: str) -> str:
    return ast.unparse(_method(module, cls, name))


def test_sequence_parallelism_is_off_so_tp_ranks_share_one_lora_factor(hpl_env):
    """optimum-neuron turns SP on unless told; only SP-tagged parameters get their gradients summed over TP,
    and peft's replicated LoRA factor is a plain nn.Linear, so with SP on each rank trains its own copy."""
    args = train_neuron.neuron_arguments(
        tiny_config(hpl_env, parallel={"tensor_parallel_size": 8, "devices_per_node": 32})
    )
    assert args["disable_sequence_parallel"] is True and args["tensor_parallel_size"] == 8
    post_init = _source("optimum.neuron.trainers.training_args", "NeuronTrainingArguments", "__post_init__")
    assert "sequence_parallel_enabled=not self.disable_sequence_parallel" in post_init
    lora_layer = ast.unparse(api_source.resolve("optimum.neuron.peft.tuners.lora.layer", "NeuronLoraLayer").node)
    assert "self.lora_A[adapter_name] = nn.Linear(self.in_features, r, bias=False)" in lora_layer
    reduce = ast.unparse(
        api_source.resolve("optimum.neuron.accelerate.optimizer", "allreduce_sequence_parallel_gradients").node
    )
    assert "getattr(p, 'sequence_parallel_enabled', False)" in reduce


def test_training_never_pushes_to_the_hub_cache(hpl_env):
    """train() ends with synchronize_hub_cache(), which asks the Hub for write access unless skip_cache_push."""
    assert train_neuron.neuron_arguments(tiny_config(hpl_env))["skip_cache_push"] is True
    train = _source("optimum.neuron", "NeuronTrainer", "train")
    assert "self.synchronize_hub_cache()" in train
    sync = _method("optimum.neuron", "NeuronTrainer", "synchronize_hub_cache")
    guard = next(node for node in ast.walk(sync) if isinstance(node, ast.If))
    assert ast.unparse(guard.test) == "not self.args.skip_cache_push"
    assert "has_write_access_to_repo" in ast.unparse(guard.body[0]) and "synchronize_hub_cache(" in ast.unparse(guard)
    fields = api_source.dataclass_fields(
        api_source.resolve("optimum.neuron.trainers.training_args", "NeuronTrainingArguments")
    )
    assert {"skip_cache_push", "disable_sequence_parallel"} <= fields


def test_attention_values_are_the_ones_optimum_neuron_runs(hpl_env):
    """flash_attention_2 is a key of optimum-neuron's attention table (the NKI kernel), eager is its default
    path, and from_pretrained puts the value on the config that LlamaAttention reads."""
    flash = train_neuron.model_arguments(tiny_config(hpl_env, data={"max_length": 2048}))["attn_implementation"]
    eager = train_neuron.model_arguments(tiny_config(hpl_env, data={"max_length": 1024}))["attn_implementation"]
    assert (flash, eager) == ("flash_attention_2", "eager")
    tree = api_source.module_tree("optimum.neuron.models.training.modeling_utils")
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "ALL_ATTENTION_FUNCTIONS"
    )
    assert flash in [key.value for key in table.keys]
    loading = _source("optimum.neuron.models.training.modeling_utils", "NeuronModelMixin", "from_pretrained")
    assert "config._attn_implementation = kwargs.pop('attn_implementation')" in loading
    attention = ast.unparse(
        api_source.resolve("optimum.neuron.models.training.llama.modeling_llama", "LlamaAttention").node
    )
    assert "self.config._attn_implementation == 'flash_attention_2'" in attention
    assert "eager_attention_forward(" in attention  # every other value takes the eager path
    sdpa = _source("optimum.neuron.models.training.modeling_utils", "NeuronModelMixin", "_sdpa_can_dispatch")
    assert "SDPA is not supported" in sdpa  # why config.py refuses train.attention = sdpa on neuron


def test_precision_and_checkpoint_arguments_are_what_optimum_neuron_reads(hpl_env):
    """save_only_model drops the optimizer from model-parallel checkpoints; stochastic rounding and the master
    weights reach MixedPrecisionConfig, which exports NEURON_RT_STOCHASTIC_ROUNDING_EN."""
    reference = tiny_config(hpl_env, train={"method": "full", "fp32_master_weights": False})
    args = train_neuron.neuron_arguments(reference)
    assert args["save_only_model"] is True and args["stochastic_rounding_enabled"] is True
    assert args["optimizer_use_master_weights"] is False and args["optimizer_use_fp32_grad_acc"] is False
    default = train_neuron.neuron_arguments(tiny_config(hpl_env))
    assert default["optimizer_use_master_weights"] is True and default["optimizer_use_fp32_grad_acc"] is True
    fields = api_source.dataclass_fields(
        api_source.resolve("optimum.neuron.trainers.training_args", "NeuronTrainingArguments")
    )
    assert {"stochastic_rounding_enabled", "optimizer_use_master_weights", "optimizer_use_fp32_grad_acc"} <= fields
    save = _source("optimum.neuron", "NeuronTrainer", "save_model")
    assert "optimizer=self.optimizer if not self.args.save_only_model else None" in save
    setup = ast.unparse(api_source.resolve("optimum.neuron.accelerate.utils.dataclasses", "MixedPrecisionConfig").node)
    assert "os.environ['NEURON_RT_STOCHASTIC_ROUNDING_EN'] = '1'" in setup
    trainer = ast.unparse(api_source.resolve("optimum.neuron", "NeuronTrainer").node)
    assert "stochastic_rounding=self.args.stochastic_rounding_enabled" in trainer
    assert "optimizer_use_master_weights=self.args.optimizer_use_master_weights" in trainer


def test_run_hands_those_values_to_the_trainer():
    """run() spreads neuron_arguments/model_arguments and passes the counted fixed-length collator."""
    tree = ast.parse((PACKAGE / "training" / "neuron" / "backend.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    calls = {ast.unparse(n.func): n for n in ast.walk(run) if isinstance(n, ast.Call)}
    spread = {ast.unparse(k.value) for k in calls["NeuronSFTConfig"].keywords if k.arg is None}
    assert spread == {"sft_arguments(cfg, plan)", "neuron_arguments(cfg)"}
    loading = calls["NeuronModelForCausalLM.from_pretrained"]
    assert [ast.unparse(k.value) for k in loading.keywords if k.arg is None] == ["model_arguments(cfg)"]
    collator = next(k.value for k in calls["NeuronSFTTrainer"].keywords if k.arg == "data_collator")
    assigned = next(
        n.value
        for n in ast.walk(run)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == ast.unparse(collator)
    )
    assert ast.unparse(assigned) == "TokenCounter(data_collator(cfg, tokenizer))"


def test_the_collator_we_pass_replaces_the_default(hpl_env):
    """NeuronSFTTrainer builds its padding-labelling default collator only when given none."""
    init = _source("optimum.neuron", "NeuronSFTTrainer", "__init__")
    assert "if data_collator is None and (not self._is_vision_dataset):" in init
    assert "data_collator=data_collator" in init


def test_the_checker_rejects_removed_and_misspelled_api():
    source = """
from optimum.neuron import NeuronSFTConfig, NeuronSFTTrainer
from optimum.neuron.models.training import NeuronModelForCausalLM
from optimum.neuron.distributed import lazy_load_for_parallelism

def build(tokenizer, model, extra):
    args = NeuronSFTConfig(output_dir="out", max_seq_length=1024)
    trainer = NeuronSFTTrainer(model=model, args=args, tokenizer=tokenizer)
    trainer.save_everything()
    loaded = NeuronModelForCausalLM.from_pretrained("id", args.trn_config, torch_dtype=None, lazy_load=True)
    loaded.eval()
    NeuronSFTConfig(**extra)
"""
    problems = "\n".join(check_module("example", source).problems)
    for expected in (
        "optimum.neuron.distributed has no lazy_load_for_parallelism",  # removed in 0.3.0
        "NeuronSFTConfig has no keyword argument 'max_seq_length'",  # renamed max_length
        "NeuronSFTTrainer has no keyword argument 'tokenizer'",  # renamed processing_class
        "NeuronSFTTrainer.save_everything does not exist",
        "from_pretrained has no keyword argument 'lazy_load'",
        "loaded holds a library object of unknown type",
        "cannot see the keys of **extra",
    ):
        assert expected in problems


def _method(module: str, cls: str, name: str) -> ast.FunctionDef:
    return api_source.member(api_source.resolve(module, cls), name)[1]


def test_resume_assumptions_hold():
    """NeuronTrainer refuses resume_from_checkpoint, and resets what ContinueStepCount sets before on_train_begin."""
    train_body = ast.unparse(_method("optimum.neuron", "NeuronTrainer", "_train"))
    assert "`resume_from_checkpoint` is not supported by the NeuronTrainer" in train_body
    setup = ast.unparse(_method("optimum.neuron", "NeuronTrainer", "setup_training"))
    order = [
        setup.index(text)
        for text in (
            "self.create_optimizer_and_scheduler",
            "self.callback_handler.lr_scheduler = self.lr_scheduler",
            "self.global_step_last_logged = 0",
            "self.callback_handler.on_train_begin",
        )
    ]
    assert order == sorted(order)
    call_event = ast.unparse(_method("transformers.trainer_callback", "CallbackHandler", "call_event"))
    assert "lr_scheduler=self.lr_scheduler" in call_event


def test_tp_that_does_not_divide_the_cores_is_refused(hpl_env, monkeypatch):
    cfg = tiny_config(hpl_env, data={"packing": False}, parallel={"tensor_parallel_size": 8, "devices_per_node": 32})
    train_neuron.check_parallel_layout(cfg, 32)
    with pytest.raises(StepError, match=r"parallel\.tensor_parallel_size 8 .*does not divide the 12 NeuronCores"):
        train_neuron.check_parallel_layout(cfg, 12)
    monkeypatch.setenv("WORLD_SIZE", "12")
    plan = neuron_plan()
    with pytest.raises(StepError, match="tensor_parallel_size"):
        train_neuron.run(cfg, parts.read(cfg), plan, {}, None)


def test_too_few_processes_per_node_names_the_launch_setting_not_tp(hpl_env):
    cfg = tiny_config(hpl_env, data={"packing": False}, parallel={"tensor_parallel_size": 8, "devices_per_node": 32})
    with pytest.raises(StepError) as unset:
        train_neuron.check_parallel_layout(cfg, 1, {"LOCAL_WORLD_SIZE": "1"})
    assert "started 1 process(es) per node (HPL_DEVICES_PER_NODE is not set, so 1 per node)" in str(unset.value)
    assert "parallel.devices_per_node is 32" in str(unset.value)
    with pytest.raises(StepError, match=r"started 2 process\(es\) per node \(HPL_DEVICES_PER_NODE=2\)"):
        train_neuron.check_parallel_layout(cfg, 4, {"LOCAL_WORLD_SIZE": "2", "HPL_DEVICES_PER_NODE": "2"})
    train_neuron.check_parallel_layout(cfg, 64, {"LOCAL_WORLD_SIZE": "32", "HPL_DEVICES_PER_NODE": "32"})


def test_neuron_backend_without_neuron_software_is_a_clear_error(hpl_env, monkeypatch):
    cfg = tiny_config(hpl_env, data={"packing": False})
    monkeypatch.setenv("WORLD_SIZE", "1")
    dolly = Dataset.from_list(dolly_records(4))  # what the data step hands over: dolly records pass the chat check
    with pytest.raises(StepError, match="needs optimum-neuron with torch-neuronx"):
        train_neuron.run(cfg, parts.read(cfg), neuron_plan(), {"train": dolly}, None)


def test_auto_backend_is_torch_without_neuron_devices():
    assert not backends.neuron_available()
    assert backends.resolve_backend("auto") == "torch"
    assert backends.resolve_backend("neuron") == "neuron"


def test_neuron_checkpoints_are_sealed_where_optimum_neuron_has_written_them(hpl_env):
    """What seal_checkpoints relies on (training/neuron/backend.py docstring), read in optimum-neuron 0.4.5:
    on_save runs on every rank right after _save_checkpoint, which ends at a rendezvous of all ranks; the
    save underneath is synchronous unless async_save, which defaults to off and which we never set."""
    maybe_save = _method("optimum.neuron", "NeuronTrainer", "maybe_save_checkpoint")
    closure = next(n for n in ast.walk(maybe_save) if isinstance(n, ast.FunctionDef) and n.name == "save_closure")
    assert [ast.unparse(statement) for statement in closure.body] == [
        "self._save_checkpoint()",
        "self.control = self.callback_handler.on_save(self.args, self.state, self.control)",
    ]
    assert "xm.add_step_closure(save_closure, (self,))" in ast.unparse(maybe_save)  # run by every rank
    save_checkpoint = _method("optimum.neuron", "NeuronTrainer", "_save_checkpoint")
    assert ast.unparse(save_checkpoint.body[-1]) == "xm.rendezvous('checkpoint_saved')"
    arguments = api_source.resolve("optimum.neuron.trainers.training_args", "NeuronTrainingArguments").node
    async_field = next(n for n in arguments.body if isinstance(n, ast.AnnAssign) and n.target.id == "async_save")
    assert "default=False" in ast.unparse(async_field.value)
    assert "async_save=self.async_save" in ast.unparse(arguments)  # into trn_config
    for module, cls in (
        ("optimum.neuron.models.training.modeling_utils", "NeuronModelMixin"),
        ("optimum.neuron.peft.peft_model", "NeuronPeftModel"),
    ):
        assert "async_save=self.trn_config.async_save" in _source(module, cls, "save_pretrained"), module
    cfg = tiny_config(hpl_env, train={"method": "full"})
    assert "async_save" not in {**sft_arguments(cfg, neuron_plan()), **train_neuron.neuron_arguments(cfg)}
    run = next(n for n in ast.parse(Path(train_neuron.__file__).read_text()).body if getattr(n, "name", "") == "run")
    handed = "seal=seal_checkpoints(args, xm.rendezvous, keep=watch.save_total_limit)"
    assert handed in ast.unparse(run)  # to add_run_callbacks


def test_the_trainer_saves_then_stops_on_the_flags_stop_after_step_sets():
    """train.stop_after_step's callback (StopAfterStep) sets should_save and should_training_stop in on_step_end:
    NeuronTrainer's loop runs on_step_end, then maybe_save_checkpoint (which saves on should_save), then leaves
    the loop on should_training_stop, with max_steps, and so the scheduler, untouched."""
    loop = _source("optimum.neuron", "NeuronTrainer", "_train")
    step_end = loop.index("self.control = self.callback_handler.on_step_end(args, self.state, self.control)")
    saving = loop.index("self.maybe_save_checkpoint()", step_end)
    assert loop.index("if self.control.should_epoch_stop or self.control.should_training_stop:", saving) > saving
    assert "if self.control.should_save:" in _source("optimum.neuron", "NeuronTrainer", "maybe_save_checkpoint")
