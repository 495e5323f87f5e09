"""train.method on the torch backend (CPU): QLoRA and DoRA train on the tiny model, full fine-tuning
becomes a model folder that loads, the profiler writes traces, and the metrics reach stdout and
TensorBoard."""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import json

import pytest
import torch
from payload_configs import neuron_plan, tiny_config, write_config
from safetensors.torch import load_file

from llm_pipeline import consolidate, data, generate, merge, train
from llm_pipeline.config import ConfigError
from llm_pipeline.errors import StepError
from llm_pipeline.training import parts
from llm_pipeline.training.neuron import backend as neuron_backend
from llm_pipeline.training.plan import adapter_config
from llm_pipeline.training.torch import backend as torch_backend
from llm_pipeline.training.torch import methods as torch_methods
from tools import tiny_model

pytestmark = pytest.mark.engine

STEPS = {"max_steps": 4, "save_steps": 4, "logging_steps": 2}
SMALL_DATA = {"validation_fraction": 0.0, "max_samples": 48}  # no evaluation, a short data step


def short_run(tmp_path, env, **train_keys):
    """(config file, config) of a 4-step run of tiny-cpu.toml with these train keys."""
    keys = {**STEPS, **train_keys}
    path = write_config(tmp_path / "run.toml", env, train=keys, data=SMALL_DATA)
    return path, tiny_config(env, train=keys, data=SMALL_DATA)


def run_train(path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train.main(["--prepare-data", "--config", str(path)]) == 0
    return out.getvalue()


def training_inputs(cfg):
    """(prepared datasets, tokenizer), preparing the data on first use."""
    data.prepare_if_stale(cfg)
    return data.training_inputs(cfg)


def unsaved_trainer(cfg, datasets, tokenizer):
    """The engine's trainer as a short run builds it (the precompile plan: nothing is saved)."""
    plan = parts.make_plan(cfg, "torch", precompile=True)
    return torch_backend.build_trainer(cfg, parts.read(cfg), plan, datasets, tokenizer)[0]


def losses(cfg, step: int) -> list[float]:
    state = json.loads((cfg.paths.checkpoints_dir / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def test_qlora_config_is_nf4_double_quant_bf16_compute_and_bf16_storage(hpl_env):
    config = torch_methods.quantization_config(parts.model_part(tiny_config(hpl_env, train={"method": "qlora"})))
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    # FSDP shards float tensors of one dtype: the packed 4-bit weights must live in bf16 tensors.
    assert config.bnb_4bit_quant_storage == torch.bfloat16
    assert torch_methods.quantization_config(parts.model_part(tiny_config(hpl_env))) is None


def test_qlora_loads_a_4bit_base_and_trains(hpl_env, tmp_path):
    """bitsandbytes 0.50 has a CPU backend, so the real 4-bit layers run here (slowly)."""
    from bitsandbytes.nn import Linear4bit

    cfg = tiny_config(hpl_env, train={"method": "qlora"})
    model = torch_methods.load_model(parts.model_part(cfg))
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Linear4bit)
    assert q_proj.weight.dtype == torch.bfloat16  # the storage dtype
    assert q_proj.weight.quant_state.quant_type == "nf4" and q_proj.weight.quant_state.nested  # double quant
    assert q_proj.compute_dtype == torch.bfloat16

    path, run = short_run(tmp_path, hpl_env, method="qlora")
    out = run_train(path)
    assert "method qlora: 16,384 trainable parameters (as expected)" in out
    assert len(losses(run, 4)) == 2
    assert (run.paths.checkpoints_dir / "checkpoint-4" / "adapter_model.safetensors").is_file()


def test_dora_trains_consolidates_and_merges_like_peft(hpl_env, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, cfg = short_run(tmp_path, hpl_env, method="dora")
    out = run_train(path)
    # LoRA's 16,384 plus one magnitude per output row of each of the 7 targets in 2 layers
    assert "method dora: 17,408 trainable parameters (as expected)" in out
    assert consolidate.main(["--config", str(path)]) == 0
    assert json.loads((cfg.paths.adapter_dir / "adapter_config.json").read_text())["use_dora"] is True
    assert merge.main(["--config", str(path)]) == 0

    base = AutoModelForCausalLM.from_pretrained(cfg.paths.model_dir, dtype=torch.float32)
    reference = PeftModel.from_pretrained(base, cfg.paths.adapter_dir).merge_and_unload().state_dict()
    ours = load_file(cfg.paths.merged_dir / "model.safetensors")
    magnitudes = load_file(cfg.paths.adapter_dir / "adapter_model.safetensors")
    assert any(not torch.allclose(t, torch.ones_like(t)) for k, t in magnitudes.items() if "magnitude" in k)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)


def test_full_fine_tuning_consolidates_to_a_model_folder_that_loads(hpl_env, tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HPL_PEAK_TFLOPS", "0.5")  # a CPU has no table entry: give it a peak for MFU
    path, cfg = short_run(tmp_path, hpl_env, method="full")
    out = run_train(path)
    assert "method full: 87,360 trainable parameters (as expected)" in out
    # metrics every logging step, on stdout and in TensorBoard
    line = next(line for line in out.splitlines() if line.startswith("step 4/4 | loss"))
    assert " | mfu " in line and "% | peak mem " in line and " GB" in line
    events = EventAccumulator(str(cfg.paths.tensorboard_dir))
    events.Reload()
    assert {"train/mfu", "train/peak_memory_gb", "train/tokens_per_second"} <= set(events.Tags()["scalars"])
    assert 0 < events.Scalars("train/mfu")[-1].value < 1

    assert consolidate.main(["--config", str(path)]) == 0
    assert merge.main(["--config", str(path)]) == 0  # nothing to merge
    assert "nothing to merge for train.method full" in capsys.readouterr().out

    folder = cfg.paths.merged_dir
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    trained = load_file(cfg.paths.checkpoints_dir / "checkpoint-4" / "model.safetensors")
    base = load_file(cfg.paths.model_dir + "/model.safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    for name, tensor in trained.items():
        assert torch.equal(loaded[name], tensor), name
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
    assert generate.main(["--config", str(path)]) == 0


def test_profiler_writes_a_trace_per_rank_and_on_a_cpu_no_allocator_snapshot(hpl_env, tmp_path):
    path, cfg = short_run(tmp_path, hpl_env, profile="2-3")
    out = run_train(path)
    traces = list(cfg.paths.profile_dir.glob("rank0*.pt.trace.json"))
    assert len(traces) == 1 and f"profile of steps 2-3 written to {cfg.paths.profile_dir}" in out
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep")} or {
        e["name"] for e in events if "aten::mm" in e.get("name", "")
    }
    assert steps, "the trace holds no operator events"
    assert not list(cfg.paths.profile_dir.glob("memory_*"))  # the CUDA allocator's record needs a GPU


def test_on_a_gpu_the_profiler_dumps_the_allocator_s_record_and_stops_recording(monkeypatch, tmp_path):
    """The GPU path with stand-ins for CUDA, each checking that the call binds to torch's real signature."""
    from types import SimpleNamespace

    from llm_pipeline.training.torch.profiling import MEMORY_HISTORY_ENTRIES, StepProfiler

    calls = []

    def stand_in(name, real):
        def call(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)
            calls.append((name, args, kwargs))

        return call

    class StandInProfiler:
        def __init__(self, **kwargs):
            inspect.signature(torch.profiler.profile).bind(**kwargs)

        def start(self):
            calls.append(("start", (), {}))

        def stop(self):
            calls.append(("stop", (), {}))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("_record_memory_history", "_dump_snapshot"):
        monkeypatch.setattr(torch.cuda.memory, name, stand_in(name, getattr(torch.cuda.memory, name)))
    monkeypatch.setattr(torch.profiler, "profile", StandInProfiler)
    profiler = StepProfiler(window=(2, 3), folder=tmp_path)
    for step in (0, 1, 2, 3):  # the Trainer's global_step before each step's begin, after its end
        state = SimpleNamespace(global_step=step)
        profiler.on_step_begin(None, state, None)
        profiler.on_step_end(None, SimpleNamespace(global_step=step + 1), None)
    profiler.on_train_end(None, SimpleNamespace(global_step=4), None)
    assert calls == [
        ("_record_memory_history", (), {"max_entries": MEMORY_HISTORY_ENTRIES}),
        ("start", (), {}),
        ("stop", (), {}),
        ("_dump_snapshot", (str(tmp_path / "memory_snapshot_rank0.pickle"),), {}),
        ("_record_memory_history", (), {"enabled": None}),
    ]


@pytest.mark.parametrize("method", ["lora", "dora", "qlora", "full"])
def test_each_method_counts_its_trainable_parameters(hpl_env, method):
    from transformers import AutoConfig

    part = parts.model_part(tiny_config(hpl_env, train={"method": method}))
    model_config = AutoConfig.from_pretrained(part.model_dir)
    expected = {"lora": 16_384, "dora": 17_408, "qlora": 16_384, "full": 87_360}[method]
    assert torch_methods.expected_trainable(model_config, part, 87_360) == expected
    assert (adapter_config(part.method, part.lora) is None) == (method == "full")
    if method != "full":
        assert adapter_config(part.method, part.lora).use_dora == (method == "dora")


@pytest.mark.parametrize(
    ("train_keys", "message"),
    [
        ({"liger_kernel": True}, "train.liger_kernel = True needs a CUDA GPU and this runtime has none: liger-kernel"),
        ({"attention": "flash_attention_2"}, "train.attention = 'flash_attention_2' needs a CUDA GPU and this"),
    ],
)
def test_a_lever_whose_package_is_missing_stops_before_training(hpl_env, tmp_path, capsys, train_keys, message):
    """liger-kernel's Triton kernels need CUDA (the package is installed here), flash-attn is not installed."""
    path, cfg = short_run(tmp_path, hpl_env, **train_keys)
    assert train.main(["--prepare-data", "--config", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert not cfg.paths.checkpoints_dir.exists()


@pytest.mark.parametrize(
    ("attention", "cuda", "flash_installed", "kernel"),
    [
        ("auto", True, True, "flash_attention_2"),  # the CUDA image
        ("auto", True, False, "sdpa"),
        ("auto", False, True, "sdpa"),  # flash-attn has no CPU kernels
        ("sdpa", True, True, "sdpa"),  # an explicit choice wins
        ("eager", False, False, "eager"),
    ],
)
def test_attention_auto_picks_flash_attention_on_cuda_when_installed(hpl_env, attention, cuda, flash_installed, kernel):
    part = parts.model_part(tiny_config(hpl_env, train={"attention": attention}))
    assert torch_methods.attention_kernel(part, cuda=cuda, flash_installed=flash_installed) == kernel
    assert torch_methods.model_kwargs(part)["attn_implementation"] == ("sdpa" if attention == "auto" else attention)


@pytest.mark.parametrize(
    ("liger", "cuda", "liger_installed", "enabled"),
    [
        ("auto", True, True, True),  # the CUDA image
        ("auto", True, False, False),
        ("auto", False, True, False),  # Triton kernels: GPU only
        (False, True, True, False),  # an explicit choice wins
        (True, False, False, True),  # and stops before training where the package is missing (above)
    ],
)
def test_liger_auto_is_on_on_cuda_when_installed(hpl_env, liger, cuda, liger_installed, enabled):
    part = parts.model_part(tiny_config(hpl_env, train={"liger_kernel": liger}))
    assert torch_methods.liger_enabled(part, cuda=cuda, liger_installed=liger_installed) is enabled


def test_liger_accepts_only_true_false_or_auto(hpl_env):
    with pytest.raises(ConfigError, match=r"train\.liger_kernel"):
        tiny_config(hpl_env, train={"liger_kernel": "yes"})


@pytest.mark.parametrize("packing", [True, False])
def test_completion_only_loss_labels_only_the_answers(hpl_env, packing):
    """The default for instruction data: trl gets prompt-completion pairs and labels every prompt token
    -100; the labelled tokens are exactly the answers (each closed by EOS), packed or padded."""
    cfg = tiny_config(hpl_env, data={**SMALL_DATA, "packing": packing})
    assert cfg.data.completion_only_loss  # the default
    datasets, tokenizer = training_inputs(cfg)
    trainer = unsaved_trainer(cfg, datasets, tokenizer)
    # what transformers is handed with the defaults on this CPU: train.liger_kernel auto resolves off, and
    # trl's deprecated switch is never used (the engine applies liger itself: methods.apply_liger)
    assert cfg.train.liger_kernel == "auto" and trainer.args.use_liger_kernel is False
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    labels = batch["labels"]
    answered = labels != -100
    assert 0 < int(answered.sum()) < int((batch["input_ids"] != tokenizer.pad_token_id).sum())
    assert torch.equal(labels[answered], batch["input_ids"][answered])
    # split at EOS, the labelled tokens are whole answers of the training records
    answers = {
        tuple(tokenizer(record["response"].strip(), add_special_tokens=False)["input_ids"])
        for record in datasets["train"]
    }
    segments, current = [], []
    for token in labels[answered].tolist():
        if token == tokenizer.eos_token_id:
            segments.append(tuple(current))
            current = []
        else:
            current.append(token)
    assert current == [] and len(segments) >= 4
    assert all(segment in answers for segment in segments)


def test_the_whole_text_is_labelled_when_completion_only_loss_is_off(hpl_env):
    cfg = tiny_config(hpl_env, data={**SMALL_DATA, "completion_only_loss": False, "packing": False})
    datasets, tokenizer = training_inputs(cfg)
    trainer = unsaved_trainer(cfg, datasets, tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    header = tokenizer("### Instruction", add_special_tokens=False)["input_ids"]
    ids = batch["input_ids"][0].tolist()
    assert any(ids[i : i + len(header)] == header for i in range(len(ids)))  # the prompt is in the row
    assert torch.equal(batch["labels"][0], batch["input_ids"][0])  # one unpadded row: every token counts


def chat_config(env, tmp_path, **data_keys):
    """The tiny config on chat-format records (two question-answer rounds each, some with a system turn)."""
    path = tiny_model.write_chat_jsonl(tmp_path / "chat.jsonl", 16)
    return tiny_config(env, data={**SMALL_DATA, "dataset": str(path), **data_keys})


def assistant_tokens(messages, tokenizer) -> list[int]:
    """The tokens of a conversation's assistant turns, each closed by EOS as the template writes it."""
    ids = []
    for turn in messages:
        if turn["role"] == "assistant":
            ids += tokenizer(turn["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids


@pytest.mark.parametrize("packing", [True, False])
def test_chat_records_are_labelled_only_on_the_assistant_turns(hpl_env, tmp_path, packing):
    """Chat-format records go through the tokenizer's chat template; with completion-only loss (the default)
    every system, user and header token is labelled -100 and the labelled tokens are exactly the assistant
    turns, in order, packed or padded."""
    cfg = chat_config(hpl_env, tmp_path, packing=packing)
    datasets, tokenizer = training_inputs(cfg)
    trainer = unsaved_trainer(cfg, datasets, tokenizer)
    assert trainer.args.assistant_only_loss
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    labels, ids = batch["labels"], batch["input_ids"]
    assert torch.equal(labels[labels != -100], ids[labels != -100])
    # each conversation's tokens, as the template writes them -> its assistant tokens
    answers = {
        tuple(tokenizer.apply_chat_template(record["messages"], return_dict=False)): assistant_tokens(
            record["messages"], tokenizer
        )
        for record in datasets["train"]
    }
    if packing:  # one row, conversations one after another, each starting at position 0
        starts = [*(batch["position_ids"][0] == 0).nonzero().flatten().tolist(), ids.shape[1]]
        segments = [(0, slice(a, b)) for a, b in itertools.pairwise(starts)]
    else:  # a conversation a row, padded on the right
        segments = [(row, slice(0, int(batch["attention_mask"][row].sum()))) for row in range(ids.shape[0])]
    assert len(segments) >= 4
    prompt_tokens = 0
    for row, span in segments:
        conversation = tuple(ids[row, span].tolist())
        assert conversation in answers  # a whole conversation of the dataset
        labelled = labels[row, span][labels[row, span] != -100].tolist()
        assert labelled == answers[conversation]
        prompt_tokens += len(conversation) - len(labelled)
    assert prompt_tokens > 0  # system, user and header tokens are in the rows, unlabelled


def test_chat_records_are_labelled_everywhere_when_completion_only_loss_is_off(hpl_env, tmp_path):
    cfg = chat_config(hpl_env, tmp_path, completion_only_loss=False, packing=False)
    datasets, tokenizer = training_inputs(cfg)
    trainer = unsaved_trainer(cfg, datasets, tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert batch["input_ids"][0].tolist() == tokenizer.apply_chat_template(
        datasets["train"][0]["messages"], return_dict=False
    )
    assert torch.equal(batch["labels"][0], batch["input_ids"][0])


def test_the_neuron_backend_refuses_chat_records(hpl_env, tmp_path, monkeypatch):
    cfg = chat_config(hpl_env, tmp_path, packing=False)  # the neuron backend refuses packing first
    monkeypatch.setenv("WORLD_SIZE", "1")
    datasets, tokenizer = training_inputs(cfg)
    with pytest.raises(StepError, match=r"data.dataset .*chat-format.* convert the records to the dolly columns"):
        neuron_backend.run(cfg, parts.read(cfg), neuron_plan(), datasets, tokenizer)


@pytest.mark.parametrize(
    ("optimizer", "library", "bits", "paged"),
    [
        ("adamw_torch", "torch", None, None),
        ("adamw_8bit", "bitsandbytes", 8, False),
        ("paged_adamw_8bit", "bitsandbytes", 8, True),
        ("paged_adamw_32bit", "bitsandbytes", 32, True),
    ],
)
def test_optimizer_option_reaches_the_trainer(hpl_env, optimizer, library, bits, paged):
    """train.optimizer: what the Trainer builds from it (bitsandbytes' 8-bit and paged AdamW for QLoRA on
    small GPUs); built here, not stepped (the paged state needs CUDA)."""
    cfg = tiny_config(hpl_env, train={"optimizer": optimizer}, data=SMALL_DATA)
    datasets, tokenizer = training_inputs(cfg)
    trainer = unsaved_trainer(cfg, datasets, tokenizer)
    built = trainer.create_optimizer()
    inner = getattr(built, "optimizer", built)
    assert type(inner).__module__.split(".")[0] == library and type(inner).__name__ == "AdamW"
    assert inner.defaults["lr"] == cfg.train.learning_rate
    if library == "bitsandbytes":
        assert (inner.args.optim_bits, inner.is_paged) == (bits, paged)
