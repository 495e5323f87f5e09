"""What the fine-tuning trainer prints while it trains, for the hpctl tests that read progress from S3."""

from __future__ import annotations

from transformers import TrainerState, TrainingArguments

from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter


def trainer_lines(capsys, tmp_path, *, step: int, total: int) -> str:
    """What the fine-tuning trainer prints up to ``step`` of ``total`` (MetricsLogger, one line per step)."""
    args = TrainingArguments(output_dir=str(tmp_path / "unused"), per_device_train_batch_size=1, report_to="none")
    state = TrainerState(max_steps=total, is_world_process_zero=True)
    tokens = TokenCounter(lambda features: features)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    logger.on_train_begin(args, state, None)
    for done in range(1, step + 1):
        logger.last_time -= 2.0
        tokens.real += 500
        state.global_step = done
        logger.on_log(args, state, None, logs={"loss": 3.0 / done, "learning_rate": 1e-5})
    return capsys.readouterr().out
