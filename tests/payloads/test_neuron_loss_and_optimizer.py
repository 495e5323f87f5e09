"""On the frozen trn1 lane: what the neuron backend's loss is computed on, and which parameters AdamW decays.

NeuronSFTTrainer prepares the dataset with trl 0.24's SFTTrainer methods (optimum-neuron builds its base class
from SFTTrainer's own members), so a real trl 0.24 SFTTrainer given what the neuron backend gives shows the
batches the Trainium run trains on. optimum-neuron's create_optimizer needs torch_xla to import: it is compiled
from its installed source, as test_neuron_training does with the default collator.
"""

from __future__ import annotations

import ast

import api_source
import pytest
import torch
from payload_configs import neuron_plan, tiny_config

from llm_pipeline import data
from llm_pipeline.prompt import prompt_completion
from llm_pipeline.training.neuron import backend as train_neuron
from llm_pipeline.training.plan import sft_arguments

pytestmark = pytest.mark.trn1

SMALL_DATA = {"validation_fraction": 0.0, "max_samples": 24, "packing": False}


def _member_source(module: str, cls: str, name: str) -> str:
    return ast.unparse(api_source.member(api_source.resolve(module, cls), name)[1])


def neuron_batch(cfg, rows: int = 6):
    """(records, collated batch, tokenizer): the neuron backend's inputs through trl 0.24's preparation."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    data.prepare_if_stale(cfg)
    datasets, tokenizer = data.training_inputs(cfg)
    records, formatter = train_neuron.sft_inputs(cfg, datasets["train"])
    loss = {"completion_only_loss": train_neuron.neuron_arguments(cfg)["completion_only_loss"]}
    args = SFTConfig(**{**sft_arguments(cfg, neuron_plan()), "bf16": False, "use_cpu": True, **loss})
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(cfg.paths.model_dir),
        args=args,
        data_collator=train_neuron.data_collator(cfg, tokenizer),
        train_dataset=records,
        processing_class=tokenizer,
        formatting_func=formatter,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(rows)])
    return datasets["train"].select(range(rows)), batch, tokenizer


def test_completion_only_loss_labels_exactly_the_response_on_neuron(hpl_env):
    """The default: in every fixed-length row the labelled tokens are those whose text starts at or after the
    end of the prompt (the tokenizer's offsets into prompt + response + EOS), the response and its EOS."""
    cfg = tiny_config(hpl_env, data=SMALL_DATA)
    assert cfg.data.completion_only_loss
    records, batch, tokenizer = neuron_batch(cfg)
    width = cfg.data.max_length
    assert batch["input_ids"].shape[1] == width
    labelled = real = 0
    for row, record in enumerate(records):
        pair = prompt_completion(record)
        text = pair["prompt"] + pair["completion"] + tokenizer.eos_token
        encoded = tokenizer(text, return_offsets_mapping=True)
        length = min(len(encoded["input_ids"]), width)
        assert batch["input_ids"][row, :length].tolist() == encoded["input_ids"][:length]
        response = [start >= len(pair["prompt"]) for start, _ in encoded["offset_mapping"][:length]]
        assert (batch["labels"][row, :length] != -100).tolist() == response
        assert (batch["labels"][row, length:] == -100).all() and batch["attention_mask"][row, length:].sum() == 0
        labelled, real = labelled + sum(response), real + length
    assert 0 < labelled < real  # the prompt is in the rows, unlabelled


def test_every_token_is_labelled_when_completion_only_loss_is_off_on_neuron(hpl_env):
    cfg = tiny_config(hpl_env, data={**SMALL_DATA, "completion_only_loss": False})
    _, batch, _ = neuron_batch(cfg)
    real = batch["attention_mask"] == 1
    assert torch.equal(batch["labels"][real], batch["input_ids"][real]) and (batch["labels"][~real] == -100).all()


def test_neuron_sft_trainer_prepares_data_as_trl_0_24_does():
    """What the tests above rely on: NeuronSFTTrainer's base class takes SFTTrainer's members, and neither it
    nor NeuronSFTTrainer replaces the dataset preparation or the kept columns (completion_mask among them)."""
    base = ast.unparse(api_source.module_tree("optimum.neuron.trainers.sft_trainer"))
    assert "_SFTTrainer = type('_SFTTrainer', (NeuronTrainer,), SFTTrainer.__dict__.copy())" in base
    neuron = api_source.resolve("optimum.neuron.trainers.sft_trainer", "NeuronSFTTrainer")
    own = {node.name for node in neuron.node.body if isinstance(node, ast.FunctionDef)}
    assert not own & {"_prepare_dataset", "_set_signature_columns_if_needed"}
    assert "'completion_mask'" in _member_source(
        "trl.trainer.sft_trainer", "SFTTrainer", "_set_signature_columns_if_needed"
    )


def upstream_optimizer_class():
    """NeuronTrainer's create_optimizer and get_decay_parameter_names, compiled from optimum-neuron 0.4.5."""
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    cls = api_source.resolve("optimum.neuron.trainers.transformers", "NeuronTrainer")
    methods = [
        node
        for node in cls.node.body
        if isinstance(node, ast.FunctionDef) and node.name in {"create_optimizer", "get_decay_parameter_names"}
    ]
    assert len(methods) == 2
    fields = {"name": "Upstream", "bases": [], "keywords": [], "body": methods, "decorator_list": []}
    if "type_params" in ast.ClassDef._fields:
        fields["type_params"] = []
    module = ast.fix_missing_locations(ast.Module([ast.ClassDef(**fields)], []))
    namespace = {
        "NxDPPModel": type("NxDPPModel", (), {}),  # only an isinstance test: the model is not pipelined here
        "get_parameter_names": get_parameter_names,
        "ALL_LAYERNORM_LAYERS": ALL_LAYERNORM_LAYERS,
    }
    exec(compile(module, "transformers.py", "exec"), namespace)
    return namespace["Upstream"]


def decayed_names(trainer, model) -> set[str]:
    trainer.model, trainer.optimizer, trainer.args = model, None, type("Args", (), {"weight_decay": 0.1})()
    trainer.optimizer_cls_and_kwargs = (torch.optim.AdamW, {"lr": 1e-3})
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    groups = trainer.create_optimizer().param_groups
    return {names[id(p)] for group in groups if group["weight_decay"] == 0.1 for p in group["params"]}


def test_weight_decay_skips_norms_and_biases_as_the_reference_does():
    """NeMo Megatron (the full fine-tuning reference) decays neither norm weights nor biases. optimum-neuron
    0.4.5 matches names containing bias/layernorm/rmsnorm only, so the final norm was decayed; the backend
    hands its trainer our grouping (run() sets get_decay_parameter_names, which create_optimizer asks)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    Upstream = upstream_optimizer_class()
    assert "model.norm.weight" in decayed_names(Upstream(), model)  # the defect, upstream as installed

    ours = Upstream()
    ours.get_decay_parameter_names = train_neuron.decay_parameter_names  # as run() does
    decayed = decayed_names(ours, model)
    every = {name for name, _ in model.named_parameters()}
    exempt = {name for name in every if name.endswith(".bias") or "norm" in name}
    assert {
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.bias",
    } <= exempt
    assert decayed == every - exempt
    assert "self.get_decay_parameter_names(opt_model)" in _member_source(
        "optimum.neuron.trainers.transformers", "NeuronTrainer", "create_optimizer"
    )
    run = next(
        n
        for n in api_source.module_tree("llm_pipeline.training.neuron.backend").body
        if getattr(n, "name", "") == "run"
    )
    assert "trainer.get_decay_parameter_names = decay_parameter_names" in ast.unparse(run)
