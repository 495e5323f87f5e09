"""train.objective = "grpo" on the torch engine: trl's GRPOTrainer, its completions sampled by the project's vLLM
server (vllm_server.py) over HTTP through trl's ``rollout_func`` hook.

trl's own server mode syncs weights over NCCL, which neither a CPU host nor the vLLM site (no trl) has; here the
policy reaches the server as what the run trains, a LoRA adapter: every grpo.sync_steps optimizer steps the trainer
saves it under the run folder (rollout/adapter) and the server loads it in place at runtime (vLLM's
/v1/load_lora_adapter, with VLLM_ALLOW_RUNTIME_LORA_UPDATING). The server runs beside the trainer (colocated) or
on the allocation's last node (grpo.rollout; rollout_server.py), and writes its address to rollout/endpoint.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.serve_job import ENDPOINT_FILE
from llm_pipeline.rollout_server import ADAPTER_NAME, rollout_dir
from llm_pipeline.training.plan import sft_arguments
from llm_pipeline.vllm_server import SERVER_START_S

REQUEST_TIMEOUT_S = 600
# GRPOConfig keys named as trl names them, from [grpo]
GRPO_KEYS = ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "loss_type")


def grpo_arguments(cfg: RunConfig, plan) -> dict:
    """GRPOConfig's keyword arguments: the SFT ones that apply, and [grpo]'s."""
    common = sft_arguments(cfg, plan)
    for sft_only in ("max_length", "packing"):
        common.pop(sft_only)
    return {
        **common,
        **{key: getattr(cfg.grpo, key) for key in GRPO_KEYS},
        "scale_rewards": cfg.grpo.scale_rewards,
        "log_completions": False,
    }


def post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        raise StepError(f"the rollout server at {url} answered {exc.code}: {exc.read().decode()[:300]}") from None
    except OSError as exc:
        raise StepError(f"the rollout server at {url} is out of reach ({exc}): see its log in rollout/") from None


def wait_for_endpoint(folder: Path, deadline_s: float) -> str:
    """The rollout server's http://host:port, once it wrote it (it writes it when it answers)."""
    endpoint = folder / ENDPOINT_FILE
    end = time.monotonic() + deadline_s
    while not endpoint.is_file():
        if time.monotonic() > end:
            raise StepError(f"no rollout server wrote {endpoint} in {deadline_s:.0f} s: see its log in {folder}")
        time.sleep(2)
    return f"http://{endpoint.read_text().strip()}"


class ServerRollouts:
    """trl's rollout_func: this process's prompts sampled by the vLLM server with the policy's current adapter."""

    def __init__(self, cfg: RunConfig, url: str = ""):
        self.cfg, self.url = cfg, url  # no url: the rollout server's, once it wrote its endpoint
        self.synced_step: int | None = None
        self.tokens = None  # the engine's TokenCounter: rollout tokens count as the step's tokens

    def sync(self, trainer) -> None:
        """Save the adapter where the server reads it, and have the server load it in place."""
        from llm_pipeline.training.torch.backend import export_adapter

        folder = rollout_dir(self.cfg) / "adapter"
        partial = folder.with_name("adapter.partial")
        if trainer.is_fsdp_enabled:
            export_adapter(trainer, partial)  # every rank gathers; rank 0 writes
        elif trainer.args.should_save:
            trainer.model.save_pretrained(str(partial))
        if trainer.args.should_save:
            shutil.rmtree(folder, ignore_errors=True)
            partial.rename(folder)
            body = {"lora_name": ADAPTER_NAME, "lora_path": str(folder), "load_inplace": True}
            post(f"{self.url}/v1/load_lora_adapter", body)
        trainer.accelerator.wait_for_everyone()
        self.synced_step = trainer.state.global_step

    def __call__(self, prompts: list[str], trainer) -> dict:
        step = trainer.state.global_step
        if not self.url:
            self.url = wait_for_endpoint(rollout_dir(self.cfg), SERVER_START_S)
        if self.synced_step is None or step - self.synced_step >= self.cfg.grpo.sync_steps:
            self.sync(trainer)
        prompt_ids = trainer.processing_class(text=prompts)["input_ids"]
        body = {
            "model": ADAPTER_NAME,
            "prompt": prompt_ids,
            "max_tokens": self.cfg.grpo.max_completion_length,
            "temperature": self.cfg.grpo.temperature,
            "logprobs": 0,
            "return_token_ids": True,
        }
        choices = sorted(json.loads(post(f"{self.url}/v1/completions", body))["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise StepError(f"the rollout server returned {len(choices)} completions for {len(prompts)} prompts")
        completion_ids = [choice["token_ids"] for choice in choices]
        logprobs = [[float(x) for x in choice["logprobs"]["token_logprobs"]] for choice in choices]
        if self.tokens is not None:
            counted = sum(map(len, prompt_ids)) + sum(map(len, completion_ids))
            self.tokens.real += counted
            self.tokens.total += counted
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def trainer_parts(cfg: RunConfig, plan, datasets, rollout_func, *argument_sets: dict) -> tuple:
    """(GRPOConfig, the trainer's data keywords): the prompt records, the reward functions, the rollouts (the
    server's unless ``rollout_func`` is given). No evaluation split: its completions would be sampled too."""
    from trl import GRPOConfig

    from llm_pipeline.training.rewards import reward_functions

    merged = {key: value for arguments in argument_sets for key, value in arguments.items()}
    args = GRPOConfig(**grpo_arguments(cfg, plan), **merged, optim=cfg.train.optimizer)
    inputs = {
        "train_dataset": datasets["train"],
        "reward_funcs": reward_functions(cfg.grpo),
        "rollout_func": rollout_func or ServerRollouts(cfg),
    }
    return args, inputs
