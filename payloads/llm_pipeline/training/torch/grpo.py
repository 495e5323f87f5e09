"""train.objective = "grpo" on the torch engine: trl's GRPOTrainer, its completions sampled by the project's vLLM
rollout server through trl's ``rollout_func`` hook (training/rollouts.py).

trl's own server mode syncs weights over NCCL, which neither a CPU host nor the vLLM site (no trl) has; here the
policy reaches the server as what the run trains, a LoRA adapter (the engine's export_adapter under FSDP2, peft's
save_pretrained in one process), loaded in place at runtime. The server runs beside the trainer (colocated) or on
the allocation's last node (grpo.rollout; rollout_server.py).
"""

from __future__ import annotations

from llm_pipeline.config import RunConfig
from llm_pipeline.training.rollouts import ServerRollouts

# GRPOConfig keys named as trl names them, from [grpo]
GRPO_KEYS = ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "loss_type")


SFT_ONLY = ("max_length", "packing")  # the shared trainer arguments GRPOConfig does not take


def grpo_arguments(cfg: RunConfig, shared: dict) -> dict:
    """GRPOConfig's keyword arguments: the ``shared`` ones (plan.sft_arguments) that apply, and [grpo]'s."""
    return {
        **{key: value for key, value in shared.items() if key not in SFT_ONLY},
        **{key: getattr(cfg.grpo, key) for key in GRPO_KEYS},
        "scale_rewards": cfg.grpo.scale_rewards,
        "log_completions": False,
    }


def trainer_parts(cfg: RunConfig, shared: dict, datasets, rollout_func, *argument_sets: dict, export) -> tuple:
    """(GRPOConfig, the trainer's data keywords): the prompt records, the reward functions, the rollouts (the
    server's unless ``rollout_func`` is given). ``shared``: the trainer arguments every objective takes
    (plan.sft_arguments). No evaluation split: its completions would be sampled too."""
    from trl import GRPOConfig

    from llm_pipeline.training.rewards import reward_functions

    merged = {key: value for arguments in argument_sets for key, value in arguments.items()}
    args = GRPOConfig(**grpo_arguments(cfg, shared), **merged, optim=cfg.train.optimizer)
    inputs = {
        "train_dataset": datasets["train"],
        "reward_funcs": reward_functions(cfg.grpo),
        "rollout_func": rollout_func or ServerRollouts(cfg, export),
    }
    return args, inputs
