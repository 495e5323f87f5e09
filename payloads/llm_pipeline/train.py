"""Train step: fine-tune the base model with train.method on train.backend.

    python -m llm_pipeline.train --config run.toml [--backend auto|neuron|torch] [--precompile]

Methods: lora (a peft adapter), dora (weight-decomposed LoRA), qlora (LoRA on a 4-bit NF4 base) and
full (every parameter, no adapter). Backends: neuron (optimum-neuron on trn1's torch-xla runtime,
tensor parallel; lora and full) and torch (trl + peft + accelerate on CUDA, Trainium2's native
`neuron` device or CPU, FSDP2 or DDP); auto picks neuron on the torch-xla runtime, else torch.
The engines live in training/neuron and training/torch; this step checks the config against the
chosen backend and reads it once into each part's record (read_run: the model's and the callbacks' of
training/parts.py, the plan, the run state's run_state.RunEnd), reads the prepared data once and hands them to the
engine, inside the run's state rules (run_state.run_in_state).

Checkpoints go to paths.checkpoints_dir/checkpoint-<step> every train.save_steps and at the last
step; TensorBoard events to paths.tensorboard_dir. A restart resumes from the newest complete
checkpoint and the step count continues; checkpoint folders newer than that one (incomplete) are
deleted first, so a save of the same step starts clean. --resume-from names the checkpoint instead
(or "none"): a training job's hosts agree on it before train (sagemaker_job, gather.agree_on_resume).
--precompile runs train.precompile_steps steps with the same settings and saves nothing: the Slurm
precompile step runs it under neuron_parallel_compile so the real run finds every graph in the compile cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline import cli, data, run_inputs, run_state
from llm_pipeline.config import BACKENDS, RunConfig, check_backend
from llm_pipeline.errors import StepError
from llm_pipeline.training import full_rules, parts
from llm_pipeline.training.backends import resolve_backend
from llm_pipeline.training.parts import FROM_BASE_MODEL, TrainParts
from llm_pipeline.training.plan import TrainPlan, say, world_size
from llm_pipeline.weights import model_files


def check_scheduler(name: str) -> None:
    from transformers import SchedulerType

    allowed = [kind.value for kind in SchedulerType]
    if name not in allowed:
        raise StepError(f"train.lr_scheduler: invalid value {name!r} (allowed: {', '.join(allowed)})")


@dataclass(frozen=True, kw_only=True)
class RunRecords:
    """The run config as the train step reads it (read_run), once and checked: the engine it trains with, the base
    model's folder, the model's and the callbacks' records (training/parts.py), the plan and the run state's record."""

    backend: str
    model_dir: Path
    parts: TrainParts
    plan: TrainPlan
    end: run_state.RunEnd


def read_run(
    cfg: RunConfig, backend_override: str | None = None, precompile: bool = False, resume_from: str | None = None
) -> RunRecords:
    """What each part needs of the run config, read once: its learning values with the config's own checks
    (config.py), the parts' records after the checks that refuse a config the chosen backend cannot run; the
    inputs' digests last (minutes for a new model's weights, then cached: run_inputs)."""
    check_scheduler(cfg.train.lr_scheduler)
    backend = resolve_backend(backend_override or cfg.train.backend)
    learned = cfg.learned()  # what its checkpoints record it learned with (RunEnd, with the digests below)
    check_backend(cfg, backend)
    model_dir = model_files.require_model_folder(Path(cfg.paths.model_dir), "the base model to train")
    run_parts = parts.read(cfg)
    plan = parts.make_plan(cfg, backend, precompile, resume_from)
    trained_from = run_inputs.trained_from(cfg, learned)
    end = run_state.RunEnd(
        checkpoints_dir=cfg.paths.checkpoints_dir, max_steps=cfg.train.max_steps, trained_from=trained_from
    )
    return RunRecords(backend=backend, model_dir=model_dir, parts=run_parts, plan=plan, end=end)


def train(
    cfg: RunConfig, backend_override: str | None = None, precompile: bool = False, resume_from: str | None = None
) -> TrainPlan:
    records = read_run(cfg, backend_override, precompile, resume_from)

    def engine(plan: TrainPlan) -> None:
        datasets, tokenizer = data.training_inputs(cfg)
        full = cfg.train.method == "full"
        if full and not precompile and cfg.train.save_checkpoints and os.environ.get("RANK", "0") == "0":
            from transformers import AutoConfig

            model_config = AutoConfig.from_pretrained(records.model_dir).to_dict()
            say(f"storage: {full_rules.check_storage(cfg, model_config, backend=records.backend)}")
        # Each engine counts what its method should train itself (optimum-neuron's layout; methods.py)
        if records.backend == "neuron":
            from llm_pipeline.training.neuron import backend as chosen
        else:
            from llm_pipeline.training.torch import backend as chosen
        chosen.run(cfg, records.parts, plan, datasets, tokenizer)

    return run_state.run_in_state(records.end, records.plan, engine, precompile=precompile)


def build_parser():
    parser = cli.parser(
        "train",
        "Fine-tune with train.method (lora, dora, qlora or full) on train.backend (neuron: Trainium, lora and "
        "full; torch: CUDA or CPU, every method); resumes from the newest checkpoint.",
    )
    parser.add_argument("--backend", choices=BACKENDS, help="override train.backend")
    parser.add_argument(
        "--precompile",
        action="store_true",
        help="run train.precompile_steps steps, save nothing (for neuron_parallel_compile)",
    )
    parser.add_argument(
        "--resume-from",
        metavar="CHECKPOINT",
        help=f"resume from this checkpoint-<step> folder ({FROM_BASE_MODEL!r}: from the base model) instead of the "
        "newest complete one in paths.checkpoints_dir (a training job's hosts agree on it first)",
    )
    parser.add_argument(
        "--prepare-data",
        action="store_true",
        help="one process: run the data step's preparation first when the run folder's copy is missing or stale",
    )
    return parser


def run(cfg: RunConfig, args) -> TrainPlan:
    if args.prepare_data:
        if world_size() > 1:  # every process would write the one data folder
            raise StepError(f"--prepare-data runs in one process: run the data step first ({data.DATA_STEP_COMMAND})")
        # what the run's checkpoints were trained from first: a refused config prepares nothing over its data
        run_state.trains_from(cfg.paths.checkpoints_dir, run_inputs.trained_from(cfg, cfg.learned()))
        data.prepare_if_stale(cfg)
    return train(cfg, args.backend, args.precompile, args.resume_from)


def main(argv=None) -> int:
    return cli.run_step(build_parser, run, argv)


if __name__ == "__main__":
    cli.exit_step(main())
