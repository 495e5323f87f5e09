"""GRPO's rollouts from the project's vLLM rollout server (rollout_server.py), as trl's ``rollout_func``: the prompts
go to its OpenAI-compatible /v1/completions as token ids (token ids and log-probabilities back), and the policy
reaches it as a LoRA adapter saved under the run folder and loaded in place at runtime (/v1/load_lora_adapter)
every grpo.sync_steps optimizer steps. Engine-agnostic HTTP; the engine hands in how it saves its adapter."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.run_files import SERVER_LOG

ROLLOUT_DIR = "rollout"  # in the run folder: the server's address and log, the synced adapter
ADAPTER_NAME = "policy"  # the name the server knows the synced adapter by
ADAPTER_FOLDER = "adapter"  # <run>/rollout/adapter-<step>: the adapter synced at that step
ENDPOINT_FILE = "endpoint"  # host:port, written once the server answers (the serve step's name for it too)
REQUEST_TIMEOUT_S = 600
# How long the trainer waits for the server's address: the server starts beside it (the same job) and loads the
# base model while the trainer loads its own copy.
ENDPOINT_WAIT_S = 1800


def rollout_dir(cfg: RunConfig) -> Path:
    return Path(cfg.paths.output_dir) / ROLLOUT_DIR


def post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        raise StepError(f"the rollout server at {url} answered {exc.code}: {exc.read().decode()[:300]}") from None
    except OSError as exc:
        raise StepError(f"the rollout server at {url} is out of reach ({exc}): see its log in rollout/") from None


def wait_for_endpoint(folder: Path, deadline_s: float, alive: Callable[[], bool] = lambda: True) -> str:
    """The rollout server's http://host:port, once it wrote it (it writes it when it answers); a StepError naming
    its log when ``alive`` says it ended first or it took over ``deadline_s``."""
    endpoint, log = folder / ENDPOINT_FILE, folder / SERVER_LOG
    end = time.monotonic() + deadline_s
    while not endpoint.is_file():
        if not alive():
            raise StepError(f"the rollout server ended before it answered: see {log}")
        if time.monotonic() > end:
            raise StepError(f"the rollout server did not write {endpoint} in {deadline_s:.0f} s: see {log}")
        time.sleep(2)
    return f"http://{endpoint.read_text().strip()}"


class ServerRollouts:
    """trl's rollout_func: this process's prompts sampled by the vLLM server with the policy's current adapter."""

    def __init__(self, cfg: RunConfig, export: Callable[[object, Path], None], url: str = ""):
        # export(trainer, folder): the engine saves the adapter there (its rank 0 writes); no url: the rollout
        # server's, once it wrote its endpoint
        self.cfg, self.export, self.url = cfg, export, url
        self.synced_step: int | None = None
        self.tokens = None  # the engine's TokenCounter: rollout tokens count as the step's tokens

    def sync(self, trainer) -> None:
        """Save the adapter where the server reads it, and have the server load it in place. Each sync writes a
        new folder (adapter-<step>): vLLM keeps prompt blocks it cached under an adapter's path, so weights
        reloaded from the same path would sample from the old policy's cached prompts."""
        step = trainer.state.global_step
        folder = rollout_dir(self.cfg) / f"{ADAPTER_FOLDER}-{step}"
        partial = folder.with_name(folder.name + ".partial")
        self.export(trainer, partial)
        if trainer.args.should_save:
            shutil.rmtree(folder, ignore_errors=True)
            partial.rename(folder)
            body = {"lora_name": ADAPTER_NAME, "lora_path": str(folder), "load_inplace": True}
            post(f"{self.url}/v1/load_lora_adapter", body)
            for earlier in folder.parent.glob(f"{ADAPTER_FOLDER}-*"):  # the server now reads only this one
                if earlier != folder:
                    shutil.rmtree(earlier, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
        self.synced_step = step

    def __call__(self, prompts: list[str], trainer) -> dict:
        step = trainer.state.global_step
        if not self.url:
            self.url = wait_for_endpoint(rollout_dir(self.cfg), ENDPOINT_WAIT_S)
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
