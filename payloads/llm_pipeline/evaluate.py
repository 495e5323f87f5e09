"""Evaluate step: is the tuned model better than the base? Validation loss, perplexity, answers.

    python -m llm_pipeline.evaluate --config run.toml

Scores the base model (paths.model_dir) and the tuned one (the merged model, else the base with the
consolidated adapter, as generate picks it) on the held-out split the data step set aside
(data.validation_fraction; the first eval.max_samples rows): each row is the training text (the
same prompt format and end-of-sequence token; chat records through the tokenizer's chat template),
cut at data.max_length, or in block mode
(data.blocks) the block itself; the loss is the training objective: the mean cross-entropy over the
answer tokens when training was completion-only (the rows as trl prepares them for the trainer, with the
every-token loss beside it), else over every predicted token, padding excluded; perplexity is exp(loss).
The first eval.answers
held-out prompts (chat records: the conversation up to its last assistant turn, by the chat template;
the generate question when there is none, or in block mode) are answered by both
models, greedily. Writes into <run>/eval/: eval.json,
report.md (the numbers, the answers side by side, the chart) and result.png, the run's one chart: its
training loss and learning rate from its own metrics, with the base and tuned validation loss.
compare shows these numbers next to the run's curve when it compares runs.

A DPO run's held-out rows are preference pairs: each model scores both answers of each pair (the summed
log-probability of the answer tokens after the prompt, split and cut as training did), and the report gives its
preference accuracy (the share of pairs whose chosen answer it finds likelier) and mean log-probability margin;
then the tuned model's DPO reward accuracy and margin against the base as reference (PREFERENCE_METRICS), the
figures trl logs as eval rewards/accuracies and rewards/margins during training, here on the finished models.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from llm_pipeline import cli, generate
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs.accounts import job_owner
from llm_pipeline.prompt import MESSAGES_COLUMN, format_example, format_prompt, is_chat
from llm_pipeline.training.plan import completion_only
from llm_pipeline.training.trained_tokens import IGNORED, prepared_records

EVAL_JSON, REPORT, RESULT_CHART = "eval.json", "report.md", "result.png"
# A DPO run's figures in eval.json and report.md: per model, then the tuned model's against the base as reference.
PREFERENCE_METRICS = {
    "preference_accuracy": "share of held-out pairs whose chosen answer the model finds likelier than the rejected",
    "logp_margin": "mean log-probability of the chosen answer minus the rejected's",
    "reward_accuracy": "share of pairs whose chosen-minus-rejected log-probability margin the tuning raised "
    "(tuned minus base > 0): DPO's reward accuracy with the base as reference",
    "reward_margin": "dpo.beta x the mean of that raise: DPO's reward margin with the base as reference",
}
OBJECTIVE_ANSWERS = "answer tokens only, as training computed its loss"
OBJECTIVE_ALL = "every token, as training computed its loss"


def held_out_rows(cfg: RunConfig) -> list[dict]:
    """The first eval.max_samples rows of the prepared validation split; [] when there is none."""
    import datasets

    folder = cfg.paths.data_dir
    if not folder.is_dir():
        raise StepError(f"no prepared data in {folder}: run the data step first")
    prepared = datasets.load_from_disk(str(folder))
    if "validation" not in prepared:
        return []
    split = prepared["validation"]
    return [split[i] for i in range(min(cfg.eval.max_samples, len(split)))]


def token_rows(rows: list[dict], tokenizer, max_length: int) -> list[list[int]]:
    """Token ids of each held-out row as training saw it: a dolly record's training text with EOS,
    cut at max_length; a block (data.blocks) as it is."""
    if rows and "input_ids" in rows[0]:
        return [list(row["input_ids"])[:max_length] for row in rows]
    if rows and is_chat(rows[0].keys()):  # chat records: the tokenizer's chat template, as trl formats them
        return [tokenizer.apply_chat_template(row[MESSAGES_COLUMN], return_dict=False)[:max_length] for row in rows]
    texts = [format_example(row) + tokenizer.eos_token for row in rows]
    return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]


def objective_rows(cfg: RunConfig, rows: list[dict], tokenizer) -> tuple[list[list[int]], list[list[int]]] | None:
    """(token ids, labels) of each held-out row as training computed its loss when it trained on the answers only
    (data.completion_only_loss): trl's own preparation, prompt and non-assistant tokens labelled -100; None when
    training scored every token (block mode, or completion_only_loss off)."""
    if not rows or "input_ids" in rows[0] or not completion_only(cfg):
        return None
    import datasets

    prepared = prepared_records(cfg, datasets.Dataset.from_list(rows), tokenizer, "evaluate")
    return [row["input_ids"] for row in prepared], [row["labels"] for row in prepared]


def score(model, rows: list[list[int]], *, batch_size: int, labels: list[list[int]] | None = None) -> dict:
    """Token-weighted mean next-token cross-entropy over the rows (padding excluded) and its exp; with ``labels``
    (the rows' tokens, -100 where not trained) over the labelled tokens only."""
    import torch

    labels = labels or rows
    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in batch], device=device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch], device=device)
        targets = torch.tensor(
            [list(t) + [IGNORED] * (width - len(t)) for t in labels[start : start + batch_size]], device=device
        )
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        shifted = targets[:, 1:].masked_fill(mask[:, 1:] == 0, IGNORED)
        total += torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=IGNORED, reduction="sum"
        ).item()
        tokens += int((shifted != IGNORED).sum())
    if tokens == 0:
        raise StepError("the held-out rows hold no token to score (check data.max_length)")
    loss = total / tokens
    return {"validation_loss": loss, "perplexity": math.exp(loss), "tokens": tokens, "rows": len(rows)}


def is_preference(rows: list[dict]) -> bool:
    from llm_pipeline.training.preference_data import PREFERENCE_COLUMNS

    return bool(rows) and set(PREFERENCE_COLUMNS) <= rows[0].keys()


def answer_logps(cfg: RunConfig, model, tokenizer, rows: list[dict]) -> list[tuple[float, float]]:
    """(chosen, rejected) summed log-probability of each pair's answer tokens after its prompt, split as trl splits
    them and cut at data.max_length."""
    import torch

    from llm_pipeline.training.preference_data import ANSWERS, answer_ids

    device = next(model.parameters()).device
    found = []
    for row in rows:
        sums = []
        for name in ANSWERS:
            prompt, answer = answer_ids(row, name, tokenizer)
            ids = (prompt + answer)[: cfg.data.max_length]
            if len(ids) <= len(prompt):
                raise StepError(f"a held-out pair's prompt fills data.max_length {cfg.data.max_length}: raise it")
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids], device=device)).logits.float()[0, :-1]
            picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
            sums.append(float(picked[len(prompt) - 1 :].sum()))
        found.append((sums[0], sums[1]))
    return found


def preference_scores(pairs: list[tuple[float, float]]) -> dict:
    margins = [chosen - rejected for chosen, rejected in pairs]
    return {
        "preference_accuracy": sum(m > 0 for m in margins) / len(margins),
        "logp_margin": sum(margins) / len(margins),
        "rows": len(margins),
        "pair_logps": pairs,
    }


def reward_scores(cfg: RunConfig, base: dict, tuned: dict) -> dict:
    """The tuned model's DPO reward accuracy and margin with the base as reference (PREFERENCE_METRICS)."""
    raised = [(tc - tr) - (bc - br) for (bc, br), (tc, tr) in zip(base["pair_logps"], tuned["pair_logps"], strict=True)]
    return {
        "reward_accuracy": sum(r > 0 for r in raised) / len(raised),
        "reward_margin": cfg.dpo.beta * sum(raised) / len(raised),
    }


def held_out_scores(cfg: RunConfig, model, tokenizer, rows: list[dict]) -> dict:
    """The validation loss as training computed it (the objective), and the all-token figure beside it when
    training trained on the answers only."""
    every = score(model, token_rows(rows, tokenizer, cfg.data.max_length), batch_size=cfg.eval.batch_size)
    objective = objective_rows(cfg, rows, tokenizer)
    if objective is None:
        return every | {"objective": OBJECTIVE_ALL}
    ids, labels = objective
    answers = score(model, ids, batch_size=cfg.eval.batch_size, labels=labels)
    return answers | {"objective": OBJECTIVE_ANSWERS, "all_tokens": every}


def tuned_model(cfg: RunConfig) -> tuple[Path, Path | None, object | None]:
    """(model folder, adapter folder, quantization) of the tuned model: a qlora adapter on the 4-bit base it
    was trained against (the run's BitsAndBytesConfig), not on the bf16 base a merge starts from; else as
    generate picks it."""
    if cfg.train.method == "qlora" and (cfg.paths.adapter_dir / generate.ADAPTER_CONFIG).is_file():
        from llm_pipeline.training.parts import model_part
        from llm_pipeline.training.torch.methods import quantization_config

        return Path(cfg.paths.model_dir), cfg.paths.adapter_dir, quantization_config(model_part(cfg))
    return (*generate.choose_model(cfg, None, None), None)


def evaluate_model(
    cfg: RunConfig, name: str, model_dir: Path, adapter_dir: Path | None, rows, prompts, quantization=None
) -> dict:
    """Load one model, score the held-out rows, answer the prompts, free it."""
    import torch

    using = f"{model_dir} + adapter {adapter_dir}" if adapter_dir else str(model_dir)
    if quantization is not None:
        using += f" (base in 4-bit {quantization.bnb_4bit_quant_type}, as trained)"
    print(f"evaluating the {name} model: {using}", flush=True)
    model, tokenizer = generate.load(model_dir, adapter_dir, cfg.model.dtype, quantization=quantization)
    if torch.cuda.is_available():
        model = model.to("cuda")
    result: dict = {"model": using}
    if is_preference(rows):
        result |= preference_scores(answer_logps(cfg, model, tokenizer, rows))
        print(
            f"{name}: preference accuracy {result['preference_accuracy']:.3f}, log-probability margin "
            f"{result['logp_margin']:+.4f} ({result['rows']} held-out pairs)",
            flush=True,
        )
    elif rows:
        result |= held_out_scores(cfg, model, tokenizer, rows)
        beside = f"; every token: {result['all_tokens']['validation_loss']:.4f}" if "all_tokens" in result else ""
        print(
            f"{name}: validation loss {result['validation_loss']:.4f} ({result['objective']}), perplexity "
            f"{result['perplexity']:.2f} ({result['rows']} rows, {result['tokens']} tokens{beside})",
            flush=True,
        )
    result["answers"] = []
    for number, prompt in enumerate(prompts, 1):
        text = generate.answer(model, tokenizer, prompt, cfg.generate.max_new_tokens, 0.0)
        result["answers"].append(text)
        print(f"{name}: answered prompt {number}/{len(prompts)}", flush=True)
    del model
    return result


def result_figure(cfg: RunConfig, scores: dict[str, dict]):
    """The run's one chart: its training loss and learning rate by step, from its own metrics, and the
    validation loss of each model in ``scores`` (base, tuned) that has one; None when the run logged no loss."""
    from llm_pipeline import charts, run_metrics

    try:
        curve = run_metrics.read_run(Path(cfg.paths.output_dir))[0]
    except StepError as exc:
        print(f"no chart: {exc}", flush=True)
        return None
    validation = [(name, found["validation_loss"]) for name, found in scores.items() if "validation_loss" in found]
    return charts.result_figure(
        curve.steps,
        curve.losses,
        validation=validation,
        learning_rates=curve.learning_rates,
        title=f"{Path(cfg.paths.output_dir).name}: training loss, base and tuned validation loss",
    )


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "(empty)"


def run_by_line(owner: dict) -> str:
    """Who ran the evaluation, under which Slurm account and QOS (a team's, on a cluster with teams)."""
    where = f", account `{owner['account']}`" if owner.get("account") else ""
    where += f", QOS `{owner['qos']}`" if owner.get("qos") else ""
    return f"- run by: `{owner['user']}`{where}"


def as_markdown(result: dict) -> str:
    base, tuned = result["base"], result["tuned"]
    lines = ["# Evaluation: base vs tuned", "", f"- base: `{base['model']}`", f"- tuned: `{tuned['model']}`"]
    lines += [*([run_by_line(result["run_by"])] if result.get("run_by") else []), ""]
    if "reward_accuracy" in result:
        lines += preference_markdown(result)
    elif result["held_out_rows"]:
        both = "all_tokens" in base
        lines += [
            f"Held-out rows scored: {result['held_out_rows']} ({base['tokens']} tokens: {base['objective']}); loss "
            "is the mean next-token cross-entropy, perplexity its exp."
            + (" Beside it, the loss over every token (prompt and answer)." if both else ""),
            "",
            "| model | validation loss | perplexity |" + (" every-token loss |" if both else ""),
            "|---|---|---|" + ("---|" if both else ""),
            *(
                f"| {name} | {scores['validation_loss']:.4f} | {scores['perplexity']:.2f} |"
                + (f" {scores['all_tokens']['validation_loss']:.4f} |" if both else "")
                for name, scores in (("base", base), ("tuned", tuned))
            ),
            "",
            f"Tuned vs base validation loss: {tuned['validation_loss'] - base['validation_loss']:+.4f}.",
        ]
    else:
        lines.append(
            "No held-out split (data.validation_fraction = 0): no validation loss. Set data.validation_fraction "
            "(e.g. 0.05) and rerun the data step for one."
        )
    lines += ["", "## Answers (greedy)", "", "| instruction | reference | base | tuned |", "|---|---|---|---|"]
    for answer in result["answers"]:
        lines.append(
            f"| {_cell(answer['instruction'])} | {_cell(answer['reference'] or '-')} "
            f"| {_cell(answer['base'])} | {_cell(answer['tuned'])} |"
        )
    if result.get("chart"):
        lines += ["", "## Training loss, validation loss, learning rate", "", f"![result]({RESULT_CHART})"]
    return "\n".join(lines) + "\n"


def preference_markdown(result: dict) -> list[str]:
    base, tuned = result["base"], result["tuned"]
    return [
        f"Held-out preference pairs scored: {result['held_out_rows']}; each answer's log-probability is summed over "
        "its tokens after the prompt.",
        "",
        "| model | preference accuracy | log-probability margin |",
        "|---|---|---|",
        *(
            f"| {name} | {scores['preference_accuracy']:.3f} | {scores['logp_margin']:+.4f} |"
            for name, scores in (("base", base), ("tuned", tuned))
        ),
        "",
        f"DPO reward accuracy {result['reward_accuracy']:.3f}, reward margin {result['reward_margin']:+.4f} (the base "
        "as reference): "
        + "; ".join(f"{key}: {PREFERENCE_METRICS[key]}" for key in ("reward_accuracy", "reward_margin")),
    ]


def preference_questions(rows: list[dict], tokenizer) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(prompt, "", chosen answer) and the prompt as the model is given it, of each preference pair."""
    from llm_pipeline.training.preference_data import text_of

    asked, prompts = [], []
    for row in rows:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            asked.append((prompt[-1]["content"], "", text_of(row["chosen"])))
            prompts.append(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False))
        else:
            asked.append((prompt, "", row["chosen"]))
            prompts.append(prompt)
    return asked, prompts


def chat_questions(rows: list[dict], tokenizer) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(question, "", reference) and the chat-template prompt of each chat record: the conversation up to its
    last assistant turn, which is the reference."""
    asked, prompts = [], []
    for row in rows:
        messages = row[MESSAGES_COLUMN]
        last = max(i for i, turn in enumerate(messages) if turn["role"] == "assistant")
        asked.append((messages[last - 1]["content"] if last else "", "", messages[last]["content"]))
        prompts.append(tokenizer.apply_chat_template(messages[:last], add_generation_prompt=True, tokenize=False))
    return asked, prompts


def evaluate(cfg: RunConfig) -> dict:
    rows = held_out_rows(cfg)
    if is_preference(rows):
        from transformers import AutoTokenizer

        asked, prompts = preference_questions(
            rows[: cfg.eval.answers], AutoTokenizer.from_pretrained(cfg.paths.model_dir)
        )
    elif rows and is_chat(rows[0].keys()):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.paths.model_dir)
        asked, prompts = chat_questions(rows[: cfg.eval.answers], tokenizer)
    elif rows and "instruction" in rows[0]:
        asked = [(row["instruction"], row.get("context") or "", row["response"]) for row in rows[: cfg.eval.answers]]
    else:  # no held-out split, or blocks of a corpus (data.blocks): the run's own question
        if not rows:
            print("no held-out split (data.validation_fraction = 0): answers only, no validation loss", flush=True)
        asked = [(cfg.generate.instruction, cfg.generate.context, None)]
    if not (rows and (is_chat(rows[0].keys()) or is_preference(rows))):
        prompts = [format_prompt(instruction, context) for instruction, context, _ in asked]
    tuned_dir, adapter_dir, quantization = tuned_model(cfg)
    base = evaluate_model(cfg, "base", Path(cfg.paths.model_dir), None, rows, prompts)
    tuned = evaluate_model(cfg, "tuned", tuned_dir, adapter_dir, rows, prompts, quantization)
    folder = cfg.paths.eval_dir
    folder.mkdir(parents=True, exist_ok=True)
    rewards = reward_scores(cfg, base, tuned) if is_preference(rows) else {}
    kept = ("answers", "pair_logps")  # per pair: the summaries stand for them
    result = {
        "held_out_rows": len(rows),
        **rewards,
        "base": {k: v for k, v in base.items() if k not in kept},
        "tuned": {k: v for k, v in tuned.items() if k not in kept},
        "answers": [
            {"instruction": instruction, "context": context, "reference": reference, "base": b, "tuned": t}
            for (instruction, context, reference), b, t in zip(asked, base["answers"], tuned["answers"], strict=True)
        ],
        "chart": None,
        "run_by": job_owner(),  # the user and the Slurm account the job ran under (docs/teams.md)
    }
    figure = result_figure(cfg, {"base": result["base"], "tuned": result["tuned"]})
    if figure is not None:
        from llm_pipeline import charts

        result["chart"] = charts.save(figure, folder / RESULT_CHART).name
    (folder / EVAL_JSON).write_text(json.dumps(result, indent=2) + "\n")
    (folder / REPORT).write_text(as_markdown(result))
    print(f"evaluation written to {folder / REPORT} and {folder / EVAL_JSON}", flush=True)
    return result


def main(argv=None) -> int:
    description = "Validation loss and perplexity of the base and the tuned model, and their answers side by side."
    return cli.run_config_only_step("evaluate", description, evaluate, argv)


if __name__ == "__main__":
    raise SystemExit(main())
