"""Torch backend: transformers + trl SFTTrainer + peft, on CPU or CUDA (also under torchrun/DDP).

The transformers Trainer resumes exactly (weights, optimizer, scheduler, RNG, data position) from
the checkpoint the plan names.
"""

from __future__ import annotations

from llm_pipeline.config import RunConfig
from llm_pipeline.prompt import format_example
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter
from llm_pipeline.training.plan import TrainPlan, check_target_modules, check_trainable, peft_lora_config, sft_arguments


def run(cfg: RunConfig, plan: TrainPlan, datasets, tokenizer, expected_trainable: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    validation = datasets.get("validation")
    evaluation = {"eval_strategy": "steps", "eval_steps": cfg.train.save_steps} if validation is not None else {}
    # trl turns gradient checkpointing on; its default reentrant form breaks DDP under torchrun
    # ("marked a variable ready only once") with peft, so use the non-reentrant form.
    checkpointing = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    # transformers refuses bf16 without a GPU unless told that the CPU is meant (CPU bf16 autocast).
    cpu_bf16 = {"use_cpu": True} if cfg.train.bf16 and not torch.cuda.is_available() else {}
    args = SFTConfig(**sft_arguments(cfg, plan), **evaluation, **checkpointing, **cpu_bf16)
    model = AutoModelForCausalLM.from_pretrained(
        cfg.paths.model_dir, dtype=torch.bfloat16 if cfg.train.bf16 else torch.float32
    )
    check_target_modules(model, cfg.lora)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets["train"],
        eval_dataset=validation,
        processing_class=tokenizer,
        peft_config=peft_lora_config(cfg.lora),
        formatting_func=format_example,
    )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    check_trainable(trainable, expected_trainable, cfg.lora)
    trainer.data_collator = tokens = TokenCounter(trainer.data_collator)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(MetricsLogger(tokens=tokens, trainable=trainable, tensorboard_dir=plan.tensorboard_dir))
    trainer.train(resume_from_checkpoint=str(plan.resume_from) if plan.resume_from else None)
