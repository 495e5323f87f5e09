"""The ladder's checkpoint storage: what each rung writes, what is kept, and whether FSx holds it.

A rung's checkpoints (torchtitan 0.2.2, components/checkpoint.py): every `checkpoint.interval`
steps a full save (fp32 weights and AdamW's two fp32 moments: 12 bytes per parameter), of which
the newest `checkpoint.keep_latest_k` stay (0: all); at the last step a model-only save in
`checkpoint.export_dtype` (`last_save_model_only`), which is never purged. For Llama 3 8B with the
base job (interval 500, keep 2, bf16) that is 2 x ~90 GiB + ~15 GiB, about 195 GiB per rung.

`torchtitan.checkpoint_retention` decides what stays once a rung is done: `all` (all of it),
`last` (only its final step: what the export reads and what tells a resubmission the rung is
finished), `none` (nothing, once the report has read the rung's metrics; the last rung keeps its
final step when `torchtitan.export_hf` is on). The prepare step checks the ladder's peak (what the
finished rungs keep plus the biggest rung in flight) against the run folder's file system.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.run_files import TITAN_STEP
from llm_pipeline.training.full_rules import FSX_SIZES, OPTIMIZER_BYTES_PER_PARAMETER
from llm_pipeline.training.torchtitan import ladder

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class RungStorage:
    rung: str
    peak: int  # bytes while the rung trains (kept full saves + its final save)
    kept: int  # bytes left once it is done, under the retention


def flavor_parameters(model_name: str, flavor: str) -> int:
    """The flavor's parameter count, from torchtitan's own model built on the meta device (no memory)."""
    import torch
    import torchtitan.protocols.train_spec as train_spec

    args = train_spec.get_train_spec(model_name).model_args[flavor]
    with torch.device("meta"):
        model = train_spec.get_train_spec(model_name).model_cls(args)
    return sum(p.numel() for p in model.parameters())


def rung_storage(cfg: RunConfig, rung: str, parameters: int) -> RungStorage:
    job = ladder.compose(cfg, rung)
    checkpoint = job.get("checkpoint", {})
    if not checkpoint.get("enable", False):
        return RungStorage(rung, 0, 0)
    full = parameters * OPTIMIZER_BYTES_PER_PARAMETER
    final = parameters * DTYPE_BYTES.get(checkpoint.get("export_dtype", "float32"), 4)
    if not checkpoint.get("last_save_model_only", False):
        final = full
    steps, interval = cfg.torchtitan.steps, int(checkpoint.get("interval", 500))
    saves = (steps - 1) // interval  # the interval saves before the last step
    keep = int(checkpoint.get("keep_latest_k", 10))
    peak = (min(saves, keep) if keep > 0 else saves) * full + final
    retention = cfg.torchtitan.checkpoint_retention
    exported = cfg.torchtitan.export_hf and rung == cfg.torchtitan.rungs[-1]
    kept = {"all": peak, "last": final, "none": final if exported else 0}[retention]
    return RungStorage(rung, peak, kept)


def ladder_peak(rungs: list[RungStorage]) -> int:
    """The most the ladder holds at once: the finished rungs' kept bytes plus the rung in flight."""
    peak, kept = 0, 0
    for rung in rungs:
        peak = max(peak, kept + rung.peak)
        kept += rung.kept
    return peak


def bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0


def check(cfg: RunConfig, parameters: int | None = None) -> str:
    """Refuse a ladder whose checkpoints cannot fit in the run folder's file system; the plan as text."""
    base = ladder.read_toml(ladder.job_file_path(cfg), "torchtitan.job_file")
    model = base.get("model", {})
    if parameters is None:
        ladder.import_custom_module(base)
        parameters = flavor_parameters(model.get("name", "llama3"), model.get("flavor", "8B"))
    rungs = [rung_storage(cfg, rung, parameters) for rung in cfg.torchtitan.rungs]
    needed = ladder_peak(rungs)
    where = Path(cfg.paths.output_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    usage = shutil.disk_usage(where)
    reusable = bytes_under(ladder.ladder_dir(cfg))  # this run's earlier checkpoints are overwritten or kept
    retention = cfg.torchtitan.checkpoint_retention
    per_rung = ", ".join(f"{r.rung} {r.peak / GIB:.1f} GiB in flight, {r.kept / GIB:.1f} GiB kept" for r in rungs)
    plan = (
        f"{parameters / 1e9:.2f}B parameters; per rung: {per_rung}; the ladder needs {needed / GIB:.1f} GiB at its "
        f"peak (torchtitan.checkpoint_retention = {retention!r}); {where} has {(usage.free + reusable) / GIB:.1f} "
        f"GiB free of {usage.total / GIB:.1f} GiB"
    )
    if needed <= usage.free + reusable:
        return plan
    advice = []
    if retention == "all":
        last = ladder_peak([rung_storage(_with_retention(cfg, "last"), r.rung, parameters) for r in rungs])
        advice.append(f'set torchtitan.checkpoint_retention = "last" (peak {last / GIB:.1f} GiB)')
    advice.append("lower checkpoint.keep_latest_k or raise checkpoint.interval (torchtitan.overrides)")
    raise StepError(
        f"the ladder's checkpoints do not fit: {plan}. {'; or '.join(advice)}; or grow the file system (FSx: the "
        f"fsx_storage_capacity_gib context of the stack, {FSX_SIZES})"
    )


def _with_retention(cfg: RunConfig, retention: str) -> RunConfig:
    return dataclasses.replace(cfg, torchtitan=dataclasses.replace(cfg.torchtitan, checkpoint_retention=retention))


def step_folders(folder: Path) -> list[tuple[int, Path]]:
    """(N, path) of every step-N folder, complete or not, by N."""
    return TITAN_STEP.folders(folder)


def retain(cfg: RunConfig, rung: str, *, metrics_read: bool) -> int:
    """Apply torchtitan.checkpoint_retention to a finished rung's checkpoint folder; bytes freed.

    After the rung's trainer (metrics_read False): `last` and `none` keep only the newest complete
    step. After the report read its metrics (metrics_read True): `none` removes that one too,
    except the exported rung's."""
    retention = cfg.torchtitan.checkpoint_retention
    folder = ladder.rung_dir(cfg, rung) / "checkpoint"
    steps = step_folders(folder)
    complete = [step for step, path in steps if (path / ".metadata").is_file()]
    if retention == "all" or not complete:
        return 0
    keep = {max(complete)}
    exported = cfg.torchtitan.export_hf and rung == cfg.torchtitan.rungs[-1]
    if retention == "none" and metrics_read and not exported:
        keep = set()
    freed = 0
    for step, path in steps:
        if step in keep:
            continue
        size = bytes_under(path)
        shutil.rmtree(path)
        freed += size
        print(f"rung {rung}: removed {path} ({size / GIB:.2f} GiB; torchtitan.checkpoint_retention = {retention!r})")
    return freed
