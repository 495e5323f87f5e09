"""What a run leaves for hpctl to read from S3, written by the writers the run uses: the fine-tuning
trainer's lines, step verdicts and the smoke run's estimate."""

from __future__ import annotations

from transformers import TrainerState, TrainingArguments

from llm_pipeline.run_files import Estimate, StepEstimate, StepVerdict
from llm_pipeline.training.callbacks import MetricsLogger, TokenCounter


def trainer_lines(capsys, tmp_path, *, step: int, total: int, losses: dict[int, float] | None = None) -> str:
    """What the fine-tuning trainer prints up to ``step`` of ``total`` (MetricsLogger, one line per step);
    the loss is 3 / step but where ``losses`` says otherwise (a diverged step: nan)."""
    args = TrainingArguments(output_dir=str(tmp_path / "unused"), per_device_train_batch_size=1, report_to="none")
    state = TrainerState(max_steps=total, is_world_process_zero=True)
    tokens = TokenCounter(lambda features: features)
    logger = MetricsLogger(tokens=tokens, trainable=1, tensorboard_dir=None)
    logger.on_train_begin(args, state, None)
    for done in range(1, step + 1):
        logger.last_time -= 2.0
        tokens.real += 500
        state.global_step = done
        logger.on_log(args, state, None, logs={"loss": (losses or {}).get(done, 3.0 / done), "learning_rate": 1e-5})
    return capsys.readouterr().out


def verdict(step: str, seconds: int, code: int = 0) -> str:
    return StepVerdict(step, "COMPLETED" if code == 0 else "FAILED", code, seconds).format() + "\n"


def estimate_json(*, seconds: float, nodes: int, note: str, partition: str = "") -> str:
    """estimate.json of a run whose one long step takes ``seconds`` on ``nodes`` nodes."""
    return Estimate("run.toml", partition, (StepEstimate("train", nodes, seconds, "measured"),), {}, note).to_json()
