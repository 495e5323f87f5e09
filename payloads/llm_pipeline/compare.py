"""Compare training runs' loss curves: one chart, one table, a match / no-match verdict.

    python -m llm_pipeline.compare RUN [RUN ...] --output DIR [--tolerance 0.05] [--steps N] [--by step|tokens]

Each RUN is a run folder (paths.output_dir) or a training log; a ladder folder gives one curve per
rung (run_metrics.py reads what each backend writes). The first curve is the reference. Curves are
aligned by optimizer step (the steps every run logged), or by tokens seen (each curve's loss
interpolated at the reference's logged token counts, within the range every run covered), over the
first N steps of the reference. For each other curve: the max and the mean of
|loss - reference| / |reference| over that window; it matches when the max is within the tolerance.
Runs with an evaluation (the evaluate step's eval/eval.json) get their base and tuned validation
loss and perplexity in the table. Writes DIR/compare.png, compare.md and compare.json.
Exit status: 0 when every curve matches, 1 when one does not, 2 on bad input (fewer than two curves: a
run's own chart is its evaluation's, <run>/eval/result.png).
hpctl's `run compare` takes S3 run prefixes too (it downloads what this reads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.errors import PipelineError, StepError
from llm_pipeline.run_metrics import LossCurve, read_run

DEFAULT_TOLERANCE = 0.05
PNG, MARKDOWN, JSON = "compare.png", "compare.md", "compare.json"


@dataclass(frozen=True)
class Difference:
    label: str
    points: tuple[float, ...]  # the x values compared (steps or tokens)
    relative: tuple[float, ...]  # |loss - reference| / |reference| at each point

    @property
    def max(self) -> float:
        return max(self.relative)

    @property
    def mean(self) -> float:
        return sum(self.relative) / len(self.relative)

    def matches(self, tolerance: float) -> bool:
        return all(math.isfinite(v) for v in self.relative) and self.max <= tolerance


def _relative(value: float, reference: float) -> float:
    return abs(value - reference) / abs(reference) if reference else math.inf


def _window(curve: LossCurve, steps: int | None) -> tuple[list[int], list[float]]:
    pairs = [(s, v) for s, v in zip(curve.steps, curve.losses, strict=True) if steps is None or s <= steps]
    return [s for s, _ in pairs], [v for _, v in pairs]


def by_step(reference: LossCurve, other: LossCurve, steps: int | None) -> Difference:
    ref_steps, ref_losses = _window(reference, steps)
    losses = dict(zip(other.steps, other.losses, strict=True))
    common = [(s, v) for s, v in zip(ref_steps, ref_losses, strict=True) if s in losses]
    if not common:
        raise StepError(
            f"{other.label} and {reference.label} logged no common step{f' up to step {steps}' if steps else ''} "
            "(set train.logging_steps the same for both, or compare --by tokens)"
        )
    return Difference(other.label, tuple(s for s, _ in common), tuple(_relative(losses[s], v) for s, v in common))


def _interpolate(x: float, xs: tuple[int, ...], ys: tuple[float, ...]) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if xs and x == xs[-1]:
        return ys[-1]
    raise ValueError(x)


def by_tokens(reference: LossCurve, other: LossCurve, steps: int | None) -> Difference:
    for curve in (reference, other):
        if curve.tokens is None:
            raise StepError(
                f"{curve.label} ({curve.source}) does not record tokens per step (model/sequences_per_step and "
                "model/sequence_length in its TensorBoard events): compare --by step"
            )
    ref_steps, ref_losses = _window(reference, steps)
    other_tokens = other.tokens
    points = [
        (s * reference.tokens_per_step, v)
        for s, v in zip(ref_steps, ref_losses, strict=True)
        if other_tokens[0] <= s * reference.tokens_per_step <= other_tokens[-1]
    ]
    if not points:
        raise StepError(f"{other.label} and {reference.label} cover no common range of tokens seen")
    relative = tuple(_relative(_interpolate(t, other_tokens, other.losses), v) for t, v in points)
    return Difference(other.label, tuple(t for t, _ in points), relative)


def differences(curves: list[LossCurve], *, by: str, steps: int | None) -> list[Difference]:
    align = by_step if by == "step" else by_tokens
    return [align(curves[0], curve, steps) for curve in curves[1:]]


def _evaluation_cells(curve: LossCurve) -> list[str]:
    evaluation = curve.evaluation or {}
    cells = []
    for model in ("base", "tuned"):
        result = evaluation.get(model) or {}
        loss, perplexity = result.get("validation_loss"), result.get("perplexity")
        cells.append("-" if loss is None else f"{loss:.4f} / {perplexity:.2f}")
    return cells


def report(curves: list[LossCurve], found: list[Difference], *, by: str, steps: int | None, tolerance: float) -> dict:
    rows = []
    for index, curve in enumerate(curves):
        difference = found[index - 1] if index else None
        rows.append(
            {
                "label": curve.label,
                "source": curve.source,
                "kind": curve.kind,
                "steps_logged": len(curve.steps),
                "last_step": curve.steps[-1],
                "last_loss": curve.losses[-1],
                "tokens_per_step": curve.tokens_per_step,
                "reference": index == 0,
                "points_compared": len(difference.points) if difference else None,
                "max_relative_difference": difference.max if difference else None,
                "mean_relative_difference": difference.mean if difference else None,
                "matches": difference.matches(tolerance) if difference else None,
                "evaluation": curve.evaluation,
            }
        )
    verdict = "match" if all(row["matches"] is not False for row in rows) else "no match"
    return {"aligned_by": by, "steps": steps, "tolerance": tolerance, "verdict": verdict, "runs": rows}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def as_markdown(result: dict, curves: list[LossCurve]) -> str:
    window = f"the first {result['steps']} steps" if result["steps"] else "every logged step"
    lines = [
        "# Loss comparison",
        "",
        f"Aligned by {result['aligned_by']} over {window} of the reference (the first run); tolerance "
        f"{result['tolerance']:.2%} on the max relative difference. Verdict: **{result['verdict']}**.",
        "",
        "| run | source | points | max rel. diff | mean rel. diff | match | last loss (step) "
        "| eval base loss / ppl | eval tuned loss / ppl |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row, curve in zip(result["runs"], curves, strict=True):
        match = "reference" if row["reference"] else ("yes" if row["matches"] else "**no**")
        base, tuned = _evaluation_cells(curve)
        lines.append(
            f"| {row['label']} | {row['kind']}: `{row['source']}` | {row['points_compared'] or '-'} "
            f"| {_pct(row['max_relative_difference'])} | {_pct(row['mean_relative_difference'])} | {match} "
            f"| {row['last_loss']:.4f} ({row['last_step']}) | {base} | {tuned} |"
        )
    return "\n".join([*lines, "", f"Chart: {PNG}", ""])


def figure(curves: list[LossCurve], found: list[Difference], *, by: str, tolerance: float):
    from llm_pipeline import charts

    x_label = "optimizer step" if by == "step" else "tokens seen (positions)"
    drawn = [(c.label, c.steps if by == "step" else c.tokens, c.losses) for c in curves]
    title = f"training loss, reference {curves[0].label}"
    return charts.loss_figure(
        drawn,
        x_label=x_label,
        title=title,
        differences=[(d.label, d.points, d.relative) for d in found],
        tolerance=tolerance if found else None,
    )


def compare(
    runs: list[Path],
    output: Path,
    *,
    by: str = "step",
    steps: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    labels: list[str] | None = None,
) -> dict:
    """Read, align, write DIR/compare.{png,md,json}; return the report."""
    from llm_pipeline import charts

    if labels and len(labels) != len(runs):
        raise StepError(f"--labels names {len(labels)} runs but {len(runs)} were given")
    curves = [curve for i, run in enumerate(runs) for curve in read_run(run, labels[i] if labels else None)]
    if len(curves) < 2:
        raise StepError(
            f"{runs[0]} holds one loss curve: compare needs two or more (its own chart is <run>/eval/result.png)"
        )
    if len({c.label for c in curves}) < len(curves):
        raise StepError("two runs have the same name: give --labels")
    found = differences(curves, by=by, steps=steps)
    result = report(curves, found, by=by, steps=steps, tolerance=tolerance)
    output.mkdir(parents=True, exist_ok=True)
    charts.save(figure(curves, found, by=by, tolerance=tolerance), output / PNG)
    (output / MARKDOWN).write_text(as_markdown(result, curves))
    (output / JSON).write_text(json.dumps(result, indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llm_pipeline.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN", help="run folders or training logs; the first is the reference"
    )
    parser.add_argument("--output", type=Path, required=True, help="folder for compare.png, compare.md, compare.json")
    parser.add_argument(
        "--by", choices=("step", "tokens"), default="step", help="align by optimizer step or tokens seen"
    )
    parser.add_argument("--steps", type=int, help="compare over the reference's first N steps (default: all)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="largest max relative loss difference that still matches (default: %(default)s)",
    )
    parser.add_argument("--labels", help="comma-separated names for the runs (default: folder names)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.steps is not None and args.steps < 1:
            raise StepError("--steps must be >= 1")
        if not args.tolerance > 0:
            raise StepError("--tolerance must be > 0")
        labels = args.labels.split(",") if args.labels else None
        result = compare(args.runs, args.output, by=args.by, steps=args.steps, tolerance=args.tolerance, labels=labels)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    print((args.output / MARKDOWN).read_text(), flush=True)
    print(f"written: {args.output / PNG}, {args.output / MARKDOWN}, {args.output / JSON}", flush=True)
    return 1 if result["verdict"] == "no match" else 0


if __name__ == "__main__":
    raise SystemExit(main())
