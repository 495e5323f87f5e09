"""Generate step: answer the run's dolly question with the fine-tuned model.

    python -m llm_pipeline.generate --config run.toml [--model-dir DIR] [--adapter-dir DIR]

By default it uses the merged model (paths.merged_dir) when there is one, else the base model
(paths.model_dir) with the consolidated adapter (paths.adapter_dir). The prompt is built by the
same function as the training texts, so the model sees the prefix it learned to continue.
"""

from __future__ import annotations

from pathlib import Path

from llm_pipeline import cli
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.prompt import format_prompt
from llm_pipeline.weights import model_files

ADAPTER_CONFIG = "adapter_config.json"


def choose_model(cfg: RunConfig, model_dir: str | None, adapter_dir: str | None) -> tuple[Path, Path | None]:
    """(model folder, adapter folder or None) from the overrides, else from the run folder."""
    paths = cfg.paths
    if model_dir or adapter_dir:
        return Path(model_dir or paths.model_dir), Path(adapter_dir) if adapter_dir else None
    if (paths.merged_dir / model_files.CONFIG_NAME).is_file():
        return paths.merged_dir, None
    if (paths.adapter_dir / ADAPTER_CONFIG).is_file():
        return Path(paths.model_dir), paths.adapter_dir
    raise StepError(
        f"no merged model in {paths.merged_dir} and no adapter in {paths.adapter_dir}: run the consolidate "
        "(and merge) steps first, or pass --model-dir / --adapter-dir"
    )


def load(model_dir: Path, adapter_dir: Path | None, dtype: str, *, quantization=None):
    """The model (with the adapter when given) and its tokenizer; ``quantization`` (a BitsAndBytesConfig) loads
    the model quantized, as qlora training loaded its base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_files.require_model_folder(model_dir, "the model to generate with")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    extra = {"quantization_config": quantization} if quantization is not None else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), **extra)
    if adapter_dir is not None:
        from peft import PeftModel

        if not (adapter_dir / ADAPTER_CONFIG).is_file():
            raise StepError(f"{adapter_dir} has no {ADAPTER_CONFIG}: not a peft adapter folder")
        model = PeftModel.from_pretrained(model, adapter_dir)
    return model.eval(), tokenizer


def answer(model, tokenizer, prompt: str, max_new_tokens: int, temperature: float) -> str:
    import torch

    encoded = tokenizer(prompt, return_tensors="pt")
    inputs = {key: encoded[key] for key in ("input_ids", "attention_mask") if key in encoded}
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def generate(cfg: RunConfig, model_dir: str | None = None, adapter_dir: str | None = None) -> str:
    model_path, adapter_path = choose_model(cfg, model_dir, adapter_dir)
    using = f"{model_path} + adapter {adapter_path}" if adapter_path else str(model_path)
    print(f"generating with {using}", flush=True)
    model, tokenizer = load(model_path, adapter_path, cfg.model.dtype)
    prompt = format_prompt(cfg.generate.instruction, cfg.generate.context)
    text = answer(model, tokenizer, prompt, cfg.generate.max_new_tokens, cfg.generate.temperature)
    if not text:
        print("warning: the model produced an empty answer", flush=True)
    cfg.paths.generation_file.parent.mkdir(parents=True, exist_ok=True)
    cfg.paths.generation_file.write_text(prompt + text + "\n")
    print(prompt + text, flush=True)
    print(f"written to {cfg.paths.generation_file}", flush=True)
    return text


def build_parser():
    parser = cli.parser("generate", "Answer the run's dolly question ([generate]) with the fine-tuned model.")
    parser.add_argument("--model-dir", help="a model folder (merged model, or the base model with --adapter-dir)")
    parser.add_argument("--adapter-dir", help="a peft adapter folder applied on top of the model")
    return parser


def main(argv=None) -> int:
    return cli.run_step(build_parser, lambda cfg, args: generate(cfg, args.model_dir, args.adapter_dir), argv)


if __name__ == "__main__":
    raise SystemExit(main())
