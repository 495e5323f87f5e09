"""GRPO on the torch engine (train.objective = "grpo"): its per-step loss and reward equal plain trl
GRPOTrainer's for the same rollouts (the same replaying rollout_func, seed, model and adapter, one process, fp32);
its rewards; bad prompt records refused in one line by name; a user's reward file checked at submit."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from payload_configs import tiny_config

from llm_pipeline import data
from llm_pipeline.config import GRPO_REWARDS, ConfigError, GrpoConfig, load, rollout_split
from llm_pipeline.errors import StepError
from llm_pipeline.training import parts, rewards
from llm_pipeline.training.plan import adapter_config
from llm_pipeline.training.torch import backend as torch_backend

pytestmark = pytest.mark.engine

STEPS = 3
ANSWERS = ("llama", "alpaca", "camel")
# What the replayed "server" answers, in turn within each group: one right answer, wrong ones, a right one with
# spaces (exact_match strips), so each group's rewards differ and the advantages are not zero.
REPLIES = ("{answer}", "wool", " {answer} ", "river herd")


def write_prompts(path: Path, count: int = 16) -> Path:
    records = [{"prompt": f"Name animal {ANSWERS[i % 3]} :", "answer": ANSWERS[i % 3]} for i in range(count)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def grpo_run(tmp_path, env, **grpo_keys):
    dataset = write_prompts(tmp_path / "prompts.jsonl")
    return tiny_config(
        env,
        data={"dataset": str(dataset), "validation_fraction": 0.0, "packing": False},
        train={
            "objective": "grpo",
            "max_steps": STEPS,
            "logging_steps": 1,
            "save_steps": 100,
            "learning_rate": 5e-2,
            "per_device_batch_size": 8,
            "bf16": False,
        },
        # beta > 0: the KL to the base (the adapter off) makes the loss depend on the weights each step reached;
        # without it an on-policy step's loss is the advantages' alone
        grpo={"num_generations": 4, "max_completion_length": 4, "beta": 0.5, "rewards": ["exact_match", "format"]}
        | {"format_pattern": "^ *(llama|alpaca|camel)"}
        | grpo_keys,
    )


class Replay:
    """A rollout_func that answers from REPLIES by position (deterministic, the same for both trainers)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0

    def __call__(self, prompts, trainer):
        self.calls += 1
        prompt_ids = self.tokenizer(text=prompts)["input_ids"]
        answers = [prompt.split()[2] for prompt in prompts]
        texts = [REPLIES[i % len(REPLIES)].format(answer=a) for i, a in enumerate(answers)]
        completion_ids = [
            self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id] for t in texts
        ]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(ids) for ids in completion_ids],
        }


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]


def plain_trl(cfg, datasets, tokenizer, replay):
    """trl's own GRPOTrainer, configured by hand with the run's values: no engine code between."""
    from transformers import AutoModelForCausalLM, set_seed
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(cfg.paths.output_dir) + "-trl",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        max_steps=STEPS,
        learning_rate=5e-2,
        lr_scheduler_type="linear",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.train.seed,
        use_cpu=True,
        bf16=False,
        num_generations=4,
        max_completion_length=4,
        temperature=1.0,
        beta=0.5,
        loss_type="dapo",
        disable_tqdm=True,
        activation_checkpointing=False,  # GRPOConfig's own default warns (transformers 5 renamed it)
    )
    set_seed(cfg.train.seed)
    model = AutoModelForCausalLM.from_pretrained(cfg.paths.model_dir, dtype="float32")
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=datasets["train"],
        processing_class=tokenizer,
        reward_funcs=[rewards.exact_match, rewards.format_reward("^ *(llama|alpaca|camel)")],
        peft_config=adapter_config(cfg.train.method, cfg.lora),
        rollout_func=replay,
    )
    trainer.train()
    return trainer


def test_engine_grpo_equals_plain_trl_for_the_same_rollouts(tmp_path, hpl_env):
    cfg = grpo_run(tmp_path, hpl_env)
    with contextlib.redirect_stdout(io.StringIO()):
        data.prepare_if_stale(cfg)
        datasets, tokenizer = data.training_inputs(cfg)
        plan = parts.make_plan(cfg, "torch", precompile=False)
        replay, run_parts = Replay(tokenizer), parts.read(cfg)
        engine = torch_backend.build_trainer(cfg, run_parts, plan, datasets, tokenizer, rollout_func=replay)[0]
        engine.train()
        plain = plain_trl(cfg, datasets, tokenizer, Replay(tokenizer))
    assert engine.rollout_func.calls == plain.rollout_func.calls == STEPS
    for key in ("loss", "kl", "reward", "rewards/exact_match/mean", "rewards/format/mean", "completions/mean_length"):
        ours, theirs = logged(engine, key), logged(plain, key)
        assert len(ours) == STEPS and ours == pytest.approx(theirs, rel=1e-6, abs=1e-9), key
    # the replies score 0.5 on exact_match (the bare and the spaced answer) and 0.5 on format (the bare one, the
    # spaced one: ' llama' matches too, 'wool' and 'river herd' do not)
    assert logged(engine, "rewards/exact_match/mean") == [0.5] * STEPS
    kl = logged(engine, "kl")
    assert kl[0] == 0 and all(math.isfinite(value) and value > 0 for value in kl[1:]), kl


def test_built_in_rewards_score_as_documented():
    assert set(GRPO_REWARDS) == {"exact_match", "format", "math_answer"}
    assert rewards.exact_match([" 7\n", "8"], answer=["7", "7"]) == [1.0, 0.0]
    assert rewards.format_reward(r"^\d+$")(["12", "a 12"]) == [1.0, 0.0]
    assert rewards.math_answer(["so it is 1,234.", "42", "none"], answer=["#### 1234", "41", "3"]) == [1.0, 0.0, 0.0]
    assert [f.__name__ for f in rewards.reward_functions(GrpoConfig(rewards=GRPO_REWARDS))] == list(GRPO_REWARDS)


def test_a_user_reward_file_is_checked_at_submit_and_loaded_by_the_step(tmp_path, hpl_env):
    (tmp_path / "my_rewards.py").write_text(
        "THRESHOLD = 3\n\ndef short(completions, **_):\n    return [1.0] * len(completions)\n"
    )
    # relative to the run config's folder, as a file beside it
    config = tmp_path / "run.toml"
    config.write_text(
        '[data]\npacking = false\n[train]\nobjective = "grpo"\n[grpo]\nrewards = ["my_rewards.py:short"]\n'
    )
    (function,) = rewards.reward_functions(load(config).grpo)
    assert function(["a", "b"]) == [1.0, 1.0]
    with pytest.raises(ConfigError, match=r"grpo.rewards: .*my_rewards.py:THRESHOLD: the file defines no function"):
        grpo_run(tmp_path, hpl_env, rewards=[f"{tmp_path}/my_rewards.py:THRESHOLD"])
    with pytest.raises(ConfigError, match=r"grpo.rewards: .*missing.py:short: no such file"):
        grpo_run(tmp_path, hpl_env, rewards=[f"{tmp_path}/missing.py:short"])


@pytest.mark.parametrize(
    ("records", "refusal"),
    [
        ([{"prompt": "a", "answer": "b"}, {"prompt": "  ", "answer": "c"}], "record 1: prompt is empty"),
        ([{"prompt": "a", "answer": 3}], "record 0: answer is int, not text"),
        ([{"question": "a", "answer": "b"}], r"lacks column\(s\) prompt \(has: question, answer\)"),
    ],
)
def test_bad_prompt_records_are_refused_in_one_line_by_name(tmp_path, hpl_env, records, refusal):
    cfg = grpo_run(tmp_path, hpl_env)
    Path(cfg.data.dataset).write_text("".join(json.dumps(record) + "\n" for record in records))
    with pytest.raises(StepError, match=refusal) as caught, contextlib.redirect_stdout(io.StringIO()):
        data.prepare(cfg)
    assert "\n" not in str(caught.value)


def test_grpo_joins_are_refused_at_load(tmp_path, hpl_env):
    with pytest.raises(ConfigError, match=r"train.method: invalid value 'full'.*lora with train.objective grpo"):
        tiny_config(hpl_env, train={"objective": "grpo", "method": "full"}, data={"packing": False})
    with pytest.raises(ConfigError, match=r"grpo.num_generations: invalid value 3 .*a divisor of the 4 completions"):
        tiny_config(hpl_env, train={"objective": "grpo"}, data={"packing": False}, grpo={"num_generations": 3})
    with pytest.raises(ConfigError, match=r"train.objective: 'grpo' cannot run on the neuron backend"):
        tiny_config(hpl_env, train={"objective": "grpo", "backend": "neuron"}, data={"packing": False})


def test_the_dry_run_shows_where_the_rollouts_run(tmp_path, hpl_env):
    """The split the train step makes of its allocation (config.rollout_split), in the dry run's table."""
    from llm_pipeline.jobs import chain
    from llm_pipeline.jobs.run_facts import RunFacts
    from llm_pipeline.submit import pipeline_jobs

    keys = {"train": {"objective": "grpo"}, "data": {"packing": False}}
    for nodes, split in ((2, "on the allocation's last node, training on the other 1 node(s)"), (1, "colocated")):
        cfg = tiny_config(hpl_env, parallel={"nodes": nodes}, **keys)
        facts = RunFacts(config=tmp_path / "run.toml", output_dir=tmp_path / "run", nodes=nodes, run=cfg)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            chain.dry_run(facts, pipeline_jobs("train", cfg), {}, smoke_stage=False)
        assert f"# train: GRPO rollouts: the vLLM server {split}" in out.getvalue()
    assert tiny_config(hpl_env).train.objective == "sft" and rollout_split(tiny_config(hpl_env)) is None


def test_the_rollout_server_takes_a_gpu_share_that_leaves_a_colocated_trainer_the_rest(hpl_env):
    """vLLM takes 90% of a GPU by default: beside the trainer (colocated) that leaves too little to train. The
    server's share follows its placement unless grpo.server_memory sets one; CPU serving takes no such argument."""
    from llm_pipeline.rollout_server import server_arguments

    def share(**keys) -> str | None:
        args = server_arguments(
            tiny_config(hpl_env, train={"objective": "grpo"}, data={"packing": False}, **keys), gpu=True
        )
        return args[args.index("--gpu-memory-utilization") + 1] if "--gpu-memory-utilization" in args else None

    assert share(parallel={"nodes": 1}) == "0.3"  # auto: colocated on one node
    assert share(parallel={"nodes": 2}) == "0.9"  # auto: a node of its own
    assert share(parallel={"nodes": 2}, grpo={"rollout": "colocated"}) == "0.3"
    assert share(parallel={"nodes": 1}, grpo={"server_memory": 0.5}) == "0.5"
    cpu = server_arguments(tiny_config(hpl_env, train={"objective": "grpo"}, data={"packing": False}), gpu=False)
    assert "--gpu-memory-utilization" not in cpu and cpu[:2] == ["--enable-lora", "--max-loras"]
    with pytest.raises(ConfigError, match=r"grpo.server_memory"):
        tiny_config(hpl_env, train={"objective": "grpo"}, data={"packing": False}, grpo={"server_memory": 1.0})


def test_the_trainer_reads_the_address_where_the_rollout_server_writes_it(tmp_path):
    from llm_pipeline.jobs import serve_job
    from llm_pipeline.training import rollouts

    assert rollouts.ENDPOINT_FILE == serve_job.ENDPOINT_FILE  # serve.serve_until_stopped writes it by that name
    (tmp_path / rollouts.ENDPOINT_FILE).write_text("10.0.0.7:8123\n")
    assert rollouts.wait_for_endpoint(tmp_path, 1) == "http://10.0.0.7:8123"
    with pytest.raises(StepError, match=r"did not write .*endpoint in 0 s: see .*none/server.log"):
        rollouts.wait_for_endpoint(tmp_path / "none", 0)
    # the server's launcher ended (train.sbatch's srun): no wait for the deadline
    with pytest.raises(StepError, match=r"the rollout server ended before it answered: see .*none/server.log"):
        rollouts.wait_for_endpoint(tmp_path / "none", 600, alive=lambda: False)


def test_the_docs_worked_example_runs_as_written(tmp_path, tiny_models_dir):
    """docs/training.md's GRPO example: its records and run config written as the page shows them, its commands run
    from their folder (the rehearsal's tiny model where the page names it)."""
    import os
    import shlex
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs" / "training.md").read_text()

    def block(name: str) -> str:
        after = text.split(f"<!-- grpo example: {name} -->\n", 1)[1]
        return after.split("```", 2)[1].split("\n", 1)[1]

    (tmp_path / "prompts.jsonl").write_text(block("prompts.jsonl"))
    (tmp_path / "grpo.toml").write_text(block("grpo.toml"))
    models = tmp_path / ".rehearsal" / "fsx" / "models"
    models.mkdir(parents=True)
    (models / "tiny-llama").symlink_to(tiny_models_dir / "tiny-llama")
    env = {**os.environ, "PYTHONPATH": str(repo / "payloads")}
    outputs = []
    for line in block("commands").splitlines():
        program, *args = shlex.split(line)
        assert program == ".venv/bin/python", line
        done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-2000:]
        outputs.append(done.stdout + done.stderr)
    preview, prepared, planned = outputs
    assert "first training prompt" in preview and "Name a llama fiber." in preview
    assert (tmp_path / "grpo-run" / "data").is_dir(), prepared
    assert "# train: GRPO rollouts: the vLLM server on the allocation's last node, training on the other 1" in planned
