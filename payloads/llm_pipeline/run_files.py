"""The lines and files a run leaves that another program reads: each format is written and read here only.

- ``ProgressLine``: the fine-tuning trainer's line per log event (training/callbacks.py), read by
  run_metrics (charts, compare), jobs/estimate, jobs/scaling_report and ``hpctl status``. Its loss
  may be ``nan`` or ``inf``: a diverged run reads as diverged, never as its last finite step.
- ``EventLine``: the trainer's line for a log event without a training loss (evaluation, the final
  summary): ``step 30/30 | eval_loss 1.234 | epoch 3``, for people and tests.
- ``ReplicasLine``: the trainer's first line (training/callbacks.py), read by jobs/estimate.
- ``SubmittedLine``: submit's line per job (jobs/chain.py), read by hpctl submit.
- ``TrainableLine``: the torch engine's trainable-parameter check, read by trn2_acceptance.
- ``BackendLine``: train.py's line naming the backend and the start, read by jobs/scaling_report.
- ``TitanMetricLine``: torchtitan 0.2.2's metric line (its MetricsProcessor.log, through its logger
  with the ``[titan] <time> - root - INFO - `` prefix), read by the ladder report, run_metrics,
  jobs/estimate and hpctl; ``titan_device`` reads its device line.
- ``StepVerdict``: the last line of a step's log, ``== <step>: <STATE> (exit N) after S s``, written by
  payloads/slurm/env.sh (with `` at <UTC time>``) and sagemaker_job.py, read by jobs/estimate and hpctl.
- ``CHECKPOINT``, ``TITAN_STEP``: a checkpoint folder's name, ``checkpoint-<step>`` (the fine-tuning trainers)
  and ``step-<step>`` (torchtitan), read by weights/, gather, run_state and training/torchtitan.
- ``StepLog``: a job's log name, <run>/logs/<step>-<job>.log (sbatch's --output, sagemaker_job.py), read
  by run_metrics, jobs/scaling_report, pretrain.py and hpctl.
- ``PipelineRecord``: <run>/logs/pipeline.json, the submission record (jobs/chain.py, sweep.py,
  sagemaker_job.py), read by jobs/pipeline_status, jobs/estimate, pretrain.py and hpctl.
- ``Estimate``: <run>/logs/estimate.json (jobs/estimate.py), read by ``submit status`` and hpctl.
- ``StepMarker``: <run>/logs/state/<step>.json, a step's state as its script last marked it (written by
  payloads/slurm/env.sh's ``hpl_mark``), read by jobs/pipeline_status (``submit status``) and hpctl.
- ``RUN_SERIES``: the run's Prometheus series (key, name, help), written by jobs/prom_textfile, charted by
  the dashboard, read by hpctl.
- ``MetricsTextfile``: the run's figures for node exporter's textfile collector (jobs/prom_textfile.py,
  from every engine's metrics logger): per series its HELP and TYPE lines and one labelled sample, NaN
  and the infinities by name as Prometheus writes them.
- ``DataStats``: <run>/data/stats.json, the data step's report on its sequences in every layout it measured
  (padded, packed, blocks) and the steps an epoch takes, read by jobs/estimate.
- ``DataSource``: <run>/data/source.json, what the data step prepared the data from (data.py), read by
  the train step to tell the data step's copy is this config's before it trains on it.
- ``TrainedFrom``: <run>/checkpoints/checkpoint-<step>/trained_from.json, what trained that checkpoint: its
  learning keys' values and the digests of its inputs (training/callbacks.SealCheckpoints writes it before the
  seal, from run_inputs.py), read by run_state.py.
- ``FinishedRecord``: <run>/checkpoints/finished.json, the step a finished run reached and what it learned
  with, copied from that checkpoint's TrainedFrom (run_state.py writes it), read by train, consolidate, merge
  and submit.
- ``AlertLine``: <run>/logs/alerts.jsonl, one line per alert the run side raised (finished, failed, NaN stop,
  stalled; jobs/alerts.py, which also publishes it to the stack's alerts topic), read by
  ``hpctl events --run``; ``NAN_STOP_OPENING`` opens the loss guard's error, which makes a failure a NaN stop.
- ``SAGEMAKER_METRICS``: the regular expressions SageMaker applies to a training job's log (the
  progress line), handed to the SDK by hpctl.

Stdlib only: the node's python3, hpctl on a laptop and the trainers all import it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

# -- the fine-tuning trainer's progress line -------------------------------------------------------------
_PROGRESS = re.compile(
    r"step (?P<step>\d+)/(?P<total>\d+) \| loss (?P<loss>\S+) \| lr (?P<lr>\S+) \| (?P<samples>\S+) samples/s"
    r" \| (?P<tokens>\S+) tokens/s(?P<extra>(?: \| [^|]+?)*) \| eta (?P<eta>.+)"
)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def describe_number(value: float, digits: int = 4) -> str:
    """A loss for people: NaN and Inf spelled so, the rest with ``digits`` decimals."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}f}"


@dataclass(frozen=True)
class ProgressLine:
    """``step 3/4 | loss 1.2000 | lr 2.00e-05 | 3.70 samples/s | 15155 tokens/s | mfu 41.2% | eta 0:00:01``.

    samples/s counts sequences over all data-parallel replicas; ``extra`` holds the optional fields
    other callbacks add (``mfu 41.2%``, ``peak mem 12.00 GB``) as printed."""

    step: int
    total: int
    loss: float
    learning_rate: float
    samples_per_second: float
    tokens_per_second: float
    eta: str
    extra: tuple[str, ...] = ()

    def format(self) -> str:
        extra = "".join(f" | {field_text}" for field_text in self.extra)
        return (
            f"step {self.step}/{self.total} | loss {self.loss:.4f} | lr {self.learning_rate:.2e} | "
            f"{self.samples_per_second:.2f} samples/s | {self.tokens_per_second:.0f} tokens/s{extra} | eta {self.eta}"
        )

    @classmethod
    def parse(cls, line: str) -> ProgressLine | None:
        found = _PROGRESS.fullmatch(line.strip())
        if not found:
            return None
        numbers = [_float(found[name]) for name in ("loss", "lr", "samples", "tokens")]
        if None in numbers:
            return None
        extra = tuple(part for part in found["extra"].split(" | ") if part)
        return cls(int(found["step"]), int(found["total"]), *numbers, found["eta"].strip(), extra)

    @classmethod
    def parse_all(cls, text: str) -> list[ProgressLine]:
        return [found for line in text.splitlines() if (found := cls.parse(line))]

    def figure(self, label: str) -> float | None:
        """The number of an extra field by its label (``reward`` of ``reward 0.1250``), None when absent."""
        for part in self.extra:  # "reward" is not "reward std 0.4": the label ends where the number starts
            if (
                part.startswith(label + " ")
                and (value := _float(part[len(label) + 1 :].split()[0].rstrip("%"))) is not None
            ):
                return value
        return None


@dataclass(frozen=True)
class EventLine:
    """``step 30/30 | eval_loss 1.234 | epoch 3``: a log event's figures, 4 significant digits (nan, inf as such)."""

    step: int
    total: int
    figures: tuple[tuple[str, float], ...]

    def format(self) -> str:
        return f"step {self.step}/{self.total} | " + " | ".join(f"{name} {value:.4g}" for name, value in self.figures)

    @classmethod
    def parse(cls, line: str) -> EventLine | None:
        """None for anything else, a progress line included (its fields are not all ``name number``)."""
        head, _, rest = line.strip().partition(" | ")
        counts = head.removeprefix("step ").split("/") if head.startswith("step ") else []
        fields = [part.split(" ") for part in rest.split(" | ")] if rest else []
        if len(counts) != 2 or not all(count.isdigit() for count in counts) or not fields:
            return None
        if any(len(part) != 2 or _float(part[1]) is None for part in fields):
            return None
        return cls(int(counts[0]), int(counts[1]), tuple((name, float(value)) for name, value in fields))


# What SageMaker reads off a training job's log into CloudWatch metrics (the progress line's fields).
SAGEMAKER_METRICS = {
    "train:loss": r"step \d+/\d+ \| loss ([0-9.]+) \|",
    "train:tokens_per_second": r"\| ([0-9]+) tokens/s",
    "train:mfu_percent": r"\| mfu ([0-9.]+)%",
}


class _OneLine:
    """A line of fixed words around its fields: ``_PATTERN`` captures them, in order, as ``_TYPES``."""

    _PATTERN: re.Pattern
    _TYPES: tuple[type, ...]

    @classmethod
    def parse(cls, line: str):
        found = cls._PATTERN.fullmatch(line.strip())
        return cls(*(kind(text) for kind, text in zip(cls._TYPES, found.groups(), strict=True))) if found else None


@dataclass(frozen=True)
class ReplicasLine(_OneLine):
    """``training steps 0 -> 40, 8 data-parallel replica(s)``: the trainer's first line."""

    first: int
    last: int
    replicas: int

    _PATTERN = re.compile(r"training steps (\d+) -> (\d+), (\d+) data-parallel replica\(s\)")
    _TYPES = (int, int, int)

    def format(self) -> str:
        return f"training steps {self.first} -> {self.last}, {self.replicas} data-parallel replica(s)"


RESUMING_FROM = "resuming from "  # a BackendLine's start when training resumes: then the checkpoint folder


@dataclass(frozen=True)
class BackendLine(_OneLine):
    """``training with the torch backend, from the base model`` (train.py; a precompile run says so)."""

    what: str  # "training" or "precompile run"
    backend: str
    start: str  # "from the base model" or RESUMING_FROM + the checkpoint folder

    _PATTERN = re.compile(r"(training|precompile run) with the (\w+) backend, (.+)")
    _TYPES = (str, str, str)

    def format(self) -> str:
        return f"{self.what} with the {self.backend} backend, {self.start}"


@dataclass(frozen=True)
class SubmittedLine(_OneLine):
    """``submitted train job 42`` (jobs/chain.py, one per job; a sweep's label adds its nodes:
    ``submitted train (2 node(s)) job 43``), read by hpctl submit and the tests."""

    label: str
    job: str

    _PATTERN = re.compile(r"submitted (.+?) job (\d+)")
    _TYPES = (str, str)

    @property
    def step(self) -> str:
        return self.label.split(" ", 1)[0]

    @classmethod
    def all(cls, text: str) -> list[SubmittedLine]:
        return [line for line in map(cls.parse, text.splitlines()) if line]

    @classmethod
    def jobs(cls, text: str) -> dict[str, str]:
        """{label: job id} of every such line in ``text``, in order."""
        return {line.label: line.job for line in cls.all(text)}

    def format(self) -> str:
        return f"submitted {self.label} job {self.job}"


@dataclass(frozen=True)
class TrainableLine(_OneLine):
    """``method lora: 1,234 trainable parameters (as expected); ...``: the torch engine's check of the adapter
    it built (training/torch/backend.py), read by trn2_acceptance."""

    method: str
    count: str  # with its thousands commas
    rest: str

    _PATTERN = re.compile(r"method (\w+): ([\d,]+) trainable parameters \(as expected\)(.*)")
    _TYPES = (str, str, str)

    @property
    def trainable(self) -> int:
        return int(self.count.replace(",", ""))

    @classmethod
    def find(cls, text: str) -> TrainableLine | None:
        """The first such line anywhere in ``text`` (a launcher may prefix its lines)."""
        found = cls._PATTERN.search(text)
        return cls(*found.groups()) if found else None

    def format(self) -> str:
        return f"method {self.method}: {self.count} trainable parameters (as expected){self.rest}"


# -- torchtitan's metric line ----------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torchtitan's colors, when a job file leaves them on
_TITAN_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"
_TITAN_PREFIX = re.compile(r"\[titan\] (?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_TITAN_METRICS = re.compile(
    r"(?<!validate )step:\s*(?P<step>\d+)\s+"
    r"loss:\s*(?P<loss>\S+)\s+"
    r"grad_norm:\s*(?P<grad_norm>\S+)\s+"
    r"memory:\s*(?P<memory_gib>[0-9.]+)GiB\((?P<memory_pct>[0-9.]+)%\)\s+"
    r"tps:\s*(?P<tps>[0-9,]+)\s+"
    r"tflops:\s*(?P<tflops>[0-9,.]+)\s+"
    r"mfu:\s*(?P<mfu>[0-9.]+)%"
)
# build_device_memory_monitor logs the device once: "CUDA capacity: NVIDIA H100 80GB HBM3 with 79.19GiB memory"
_TITAN_DEVICE = re.compile(r"(?P<kind>[A-Z]+) capacity: (?P<name>.+?) with (?P<gib>[0-9.]+)GiB memory")


def plain(text: str) -> str:
    """``text`` without ANSI color codes."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class TitanMetricLine:
    """``step: 10  loss:  9.12345  grad_norm:  1.2345  memory: 61.05GiB(77.17%)  tps: 6,475  tflops: 374.71
    mfu: 37.89%``; tps is tokens per second per GPU. ``time`` is the logger's stamp where the line has it."""

    step: int
    loss: float
    grad_norm: float
    memory_gib: float
    memory_pct: float
    tps: int
    tflops: float
    mfu: float
    time: datetime | None = field(default=None, compare=False)

    def format(self) -> str:
        message = (
            f"step: {self.step:2}  loss: {self.loss:8.5f}  grad_norm: {self.grad_norm:7.4f}  "
            f"memory: {self.memory_gib:5.2f}GiB({self.memory_pct:.2f}%)  tps: {self.tps:,}  "
            f"tflops: {self.tflops:,.2f}  mfu: {self.mfu:.2f}%"
        )
        if self.time is None:
            return message
        return f"[titan] {self.time.strftime(_TITAN_TIME_FORMAT)[:-3]} - root - INFO - {message}"

    @classmethod
    def parse(cls, line: str) -> TitanMetricLine | None:
        text = plain(line).strip()
        found = _TITAN_METRICS.search(text)
        if not found:
            return None
        loss, grad_norm = _float(found["loss"]), _float(found["grad_norm"])
        if loss is None or grad_norm is None:
            return None
        stamp = _TITAN_PREFIX.match(text)
        return cls(
            step=int(found["step"]),
            loss=loss,
            grad_norm=grad_norm,
            memory_gib=float(found["memory_gib"]),
            memory_pct=float(found["memory_pct"]),
            tps=int(found["tps"].replace(",", "")),
            tflops=float(found["tflops"].replace(",", "")),
            mfu=float(found["mfu"]),
            time=datetime.strptime(stamp["time"], _TITAN_TIME_FORMAT) if stamp else None,
        )

    @classmethod
    def parse_all(cls, text: str) -> list[TitanMetricLine]:
        return [found for line in text.splitlines() if (found := cls.parse(line))]


def titan_device(text: str) -> str:
    """The accelerator torchtitan's log names (``NVIDIA H100 80GB HBM3 (79.19 GiB)``), or "unknown"."""
    found = _TITAN_DEVICE.search(plain(text))
    return f"{found['name']} ({found['gib']} GiB)" if found else "unknown"


# -- the step verdict -----------------------------------------------------------------------------------
_VERDICT = re.compile(
    r"== (?P<step>\S+): (?P<state>[A-Z]+) \(exit (?P<exit>-?\d+)\) after (?P<seconds>\d+) s(?: at (?P<at>\S+))?"
)


@dataclass(frozen=True)
class StepVerdict:
    """``== train: COMPLETED (exit 0) after 12 s at 2026-01-01T10:00:00Z``: how a step's log ends
    (``at``: the UTC time, where env.sh writes it)."""

    step: str
    state: str  # COMPLETED, FAILED or CANCELLED
    exit_code: int
    seconds: int
    at: str | None = None

    def format(self) -> str:
        at = f" at {self.at}" if self.at else ""
        return f"== {self.step}: {self.state} (exit {self.exit_code}) after {self.seconds} s{at}"

    @classmethod
    def parse(cls, line: str) -> StepVerdict | None:
        found = _VERDICT.fullmatch(plain(line).strip())
        if not found:
            return None
        return cls(found["step"], found["state"], int(found["exit"]), int(found["seconds"]), found["at"])

    @classmethod
    def last(cls, text: str, step: str) -> StepVerdict | None:
        """The last verdict on ``step`` in a log's text, or None while the step runs."""
        verdicts = [found for line in text.splitlines() if (found := cls.parse(line)) and found.step == step]
        return verdicts[-1] if verdicts else None


# -- <run>/logs/pipeline.json ----------------------------------------------------------------------------
PIPELINE_FILE = "pipeline.json"
ESTIMATE_FILE = "estimate.json"


@dataclass(frozen=True)
class StepJob:
    """One submitted job of the record."""

    step: str
    job: str
    log: str
    nodes: int = 1
    config: str = ""  # the run config the job ran with ("": the record's); a sweep's points each have their own


@dataclass(frozen=True)
class PipelineRecord:
    """What submit wrote: the run config and each job in submission order."""

    config: str
    steps: tuple[StepJob, ...]

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "steps": [asdict(job) for job in self.steps]}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PipelineRecord:
        body = json.loads(text)
        return cls(str(body.get("config", "")), tuple(StepJob(**entry) for entry in body["steps"]))


# -- checkpoint folders: checkpoint-<step> (the fine-tuning trainers), step-<step> (torchtitan) ----------------
@dataclass(frozen=True)
class StepFolders:
    """Folders named ``<prefix><step>``: one step's checkpoint each."""

    prefix: str

    def name(self, step: int | str) -> str:
        return f"{self.prefix}{step}"

    def step_of(self, name: str) -> int | None:
        found = re.fullmatch(rf"{re.escape(self.prefix)}(\d+)", name)
        return int(found[1]) if found else None

    def folders(self, container: Path) -> list[tuple[int, Path]]:
        """(step, folder) of every such folder in ``container``, complete or not, oldest first."""
        if not container.is_dir():
            return []
        found = [(step, path) for path in container.iterdir() if (step := self.step_of(path.name)) is not None]
        return sorted((step, path) for step, path in found if path.is_dir())


CHECKPOINT = StepFolders("checkpoint-")  # paths.checkpoints_dir/checkpoint-<step>: the Trainer's and optimum-neuron's
TITAN_STEP = StepFolders("step-")  # <rung dump folder>/checkpoint/step-<step>: torchtitan 0.2.2's


# -- <run>/logs/<step>-<job>.log: each job's log -----------------------------------------------------------
_STEP_LOG = re.compile(r"(?P<step>.+)-(?P<job>\d+)\.log")
SLURM_JOB_ID = "%j"  # sbatch --output fills it with the job id


# -- <run>/benchmark/: the benchmark step's results (benchmark.py), read by `hpctl status` too ---------------------
BENCHMARK_DIR, BENCHMARK_JSON = "benchmark", "benchmark.json"


SERVER_LOG = "server.log"  # in its folder: a served model's vLLM output (serve, rollout_server)


def server_log(model: str) -> str:
    """The vLLM server's log of one model (base or tuned) beside the benchmark's results (benchmark.py)."""
    return f"server-{model}.log"


@dataclass(frozen=True)
class StepLog:
    """A job's log file name, ``<step>-<job>.log``: written by sbatch (``--output``, chain.py), the training
    job's hosts (sagemaker_job.py), read by run_metrics, the sweep's report, pretrain and hpctl."""

    step: str
    job: str

    @property
    def name(self) -> str:
        return f"{self.step}-{self.job}.log"

    @classmethod
    def parse(cls, name: str) -> StepLog | None:
        found = _STEP_LOG.fullmatch(name)
        return cls(found["step"], found["job"]) if found else None

    @classmethod
    def of(cls, folder: Path, steps: Callable[[str], bool]) -> list[tuple[StepLog, Path]]:
        """The logs in ``folder`` of the steps ``steps`` accepts, oldest job first."""
        found = [(log, path) for path in folder.glob("*.log") if (log := cls.parse(path.name)) and steps(log.step)]
        return sorted(found, key=lambda item: (int(item[0].job), item[0].step))


# -- <run>/logs/estimate.json ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepEstimate:
    step: str
    nodes: int
    seconds: float
    basis: str  # how the duration was found

    @property
    def node_hours(self) -> float:
        return self.seconds * self.nodes / 3600


@dataclass(frozen=True)
class Estimate:
    """How long the long steps take and what they occupy, from the smoke stage (jobs/estimate.py)."""

    config: str
    partition: str  # the Slurm partition ("" in a training job): hpctl prices its instance type
    steps: tuple[StepEstimate, ...]
    seconds_per_step: dict[str, float]  # per training job (train, rung-<name>, train@<nodes> in a sweep)
    note: str

    @property
    def total_seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    @property
    def node_hours(self) -> float:
        return sum(step.node_hours for step in self.steps)

    def to_json(self) -> str:
        body = {
            "config": self.config,
            "partition": self.partition,
            "steps": [asdict(step) | {"node_hours": step.node_hours} for step in self.steps],
            "seconds_per_step": self.seconds_per_step,
            "total_seconds": self.total_seconds,
            "node_hours": self.node_hours,
            "note": self.note,
        }
        return json.dumps(body, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Estimate:
        body = json.loads(text)
        steps = tuple(
            StepEstimate(row["step"], int(row["nodes"]), float(row["seconds"]), row["basis"]) for row in body["steps"]
        )
        return cls(body["config"], body["partition"], steps, dict(body["seconds_per_step"]), body["note"])


# -- <run>/data/source.json ------------------------------------------------------------------------------
DATA_SOURCE_FILE = "source.json"


@dataclass(frozen=True)
class DataSource:
    """What a prepared copy of the data was made from: the [data] config, the seed of its split, and
    digests of the tokenizer files and of the local dataset file(s) ("" for a Hub dataset or when not recorded), and
    the train.objective whose records it holds (a copy written before objectives were recorded holds sft's)."""

    data: dict
    seed: int
    tokenizer: str = ""
    dataset_files: str = ""
    objective: str = "sft"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DataSource:
        body = json.loads(text)
        return cls(
            dict(body["data"]),
            int(body["seed"]),
            str(body.get("tokenizer", "")),
            str(body.get("dataset_files", "")),
            str(body.get("objective", "sft")),
        )

    def changes(self, now: DataSource) -> list[str]:
        """What differs in ``now`` from this record, named by its config key (empty when nothing does)."""
        keys = sorted(set(self.data) | set(now.data))
        changed = [
            f"data.{key} (prepared with {self.data.get(key)!r}, now {now.data.get(key)!r})"
            for key in keys
            if self.data.get(key) != now.data.get(key)
        ]
        if self.seed != now.seed:
            changed.append(f"train.seed (prepared with {self.seed}, now {now.seed})")
        if self.tokenizer != now.tokenizer:
            changed.append("tokenizer (the tokenizer files in paths.model_dir differ)")
        if self.dataset_files != now.dataset_files:
            changed.append("data.dataset file(s) (written again since)")
        if self.objective != now.objective:
            changed.append(f"train.objective (prepared for {self.objective}, now {now.objective})")
        return changed


# -- <run>/data/stats.json -------------------------------------------------------------------------------
DATA_STATS_FILE = "stats.json"  # in paths.data_dir, beside the prepared data
# How the train step lays out its sequences, and the report's section for each layout.
DATA_LAYOUTS = {"padded": "padded_to_max_length", "packed": "packed", "blocks": "blocks"}


def data_layout(blocks: bool, packing: bool) -> str:
    """The layout the train step reads (data.blocks, data.packing): a DATA_LAYOUTS key."""
    return "blocks" if blocks else "packed" if packing else "padded"


@dataclass(frozen=True)
class LayoutStats:
    """One layout's sequences, their padding, and the optimizer steps an epoch takes on ``replicas``."""

    sequences: int
    pad_fraction: float
    optimizer_steps_per_epoch: int
    replicas: int


@dataclass(frozen=True)
class DataStats:
    """The data step's report (data.py, training/data_stats and text_blocks), read by jobs/estimate for an
    epochs-based run's step count. ``mode``: the layout training reads; ``layouts``: every layout measured
    (padded and packed, or blocks); ``counts``: the rest, for people (examples, tokens, truncation)."""

    mode: str
    layouts: dict[str, LayoutStats]
    counts: dict = field(default_factory=dict)

    @property
    def trained(self) -> LayoutStats:
        return self.layouts[self.mode]

    def to_json(self) -> str:
        sections = {DATA_LAYOUTS[name]: asdict(stats) for name, stats in self.layouts.items()}
        return json.dumps({"mode": self.mode, **self.counts, **sections}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DataStats:
        body = json.loads(text)
        layouts = {name: LayoutStats(**body.pop(key)) for name, key in DATA_LAYOUTS.items() if key in body}
        mode = body.pop("mode")
        if mode not in layouts:
            raise KeyError(f"the report has no {mode!r} section")
        return cls(mode, layouts, body)


# -- <run>/checkpoints/checkpoint-<step>/trained_from.json ------------------------------------------------
TRAINED_FROM_FILE = "trained_from.json"  # in each checkpoint folder, written before its seals (which list it)


# What a checkpoint was trained from besides its keys, by name: where each is read (run_inputs.py digests them).
INPUTS = {
    "model weights": "the weight files and config.json in paths.model_dir",
    "tokenizer": "the tokenizer files in paths.model_dir",
    "dataset": "the local file(s) data.dataset names",
    "prepared data": "the data step's copy in paths.data_dir",
}


@dataclass(frozen=True)
class TrainedFrom:
    """What trained a checkpoint: by section, the values of the keys that change what a run learns
    (config.learning_keys), and by input (run_inputs.INPUTS) a digest of what it read ("" where there was none:
    a Hub dataset has no local file). A record lacking a section, key or input does not compare it."""

    learned: dict[str, dict]
    inputs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"learned": self.learned, "inputs": self.inputs}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TrainedFrom:
        body = json.loads(text)
        learned = {name: dict(values) for name, values in body["learned"].items()}
        return cls(learned, {str(name): str(digest) for name, digest in body.get("inputs", {}).items()})


# -- <run>/checkpoints/finished.json --------------------------------------------------------------------
FINISHED_FILE = "finished.json"  # in paths.checkpoints_dir, next to the checkpoint it names
_INPUTS = "inputs"  # the marker's section of input digests; every other table is a learning section


@dataclass(frozen=True)
class FinishedRecord:
    """``{"step": 12, "inputs": {...}, "train": {...}, "lora": {...}, "data": {...}}``: the step a finished run
    reached (its end) and what trained that checkpoint (its TrainedFrom): by section, the values of the keys that
    changed what it learned, and the digests of its inputs. A marker written before lora or the inputs were
    recorded lacks them: what a record lacks is not compared."""

    step: int
    learned: dict[str, dict]
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def trained_from(self) -> TrainedFrom:
        return TrainedFrom(self.learned, self.inputs)

    def to_json(self) -> str:
        return json.dumps({"step": self.step, _INPUTS: self.inputs, **self.learned}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> FinishedRecord:
        body = json.loads(text)
        inputs = {str(name): str(digest) for name, digest in body.pop(_INPUTS, {}).items()}
        learned = {name: dict(values) for name, values in body.items() if isinstance(values, dict)}
        return cls(int(body["step"]), learned, inputs)


# -- <run>/logs/state/<step>.json ------------------------------------------------------------------------
STATE_DIR = "state"  # beside the step logs
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class StepMarker:
    """``{"step": "train", "job": "12", "state": "RUNNING", "exit": null, "node": "ip-10-1-2-3", "time": "..."}``:
    RUNNING when the step script starts, its final state and exit code when it ends (``time``: UTC)."""

    step: str
    job: str
    state: str  # RUNNING or one of FINAL_STATES
    exit_code: int | None = None
    node: str = ""
    time: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def to_json(self) -> str:
        body = {"step": self.step, "job": self.job, "state": self.state, "exit": self.exit_code}
        return json.dumps(body | {"node": self.node, "time": self.time}) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StepMarker:
        body = json.loads(text)
        exit_code = body.get("exit")
        return cls(
            str(body["step"]),
            str(body["job"]),
            str(body["state"]),
            None if exit_code is None else int(exit_code),
            str(body.get("node", "")),
            str(body.get("time", "")),
        )


# -- node exporter's textfile ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSeries:
    """One of the run's Prometheus series: the figure's key (the engines' log events, jobs/prom_textfile,
    `hpctl metrics`), its name, and what it is (its HELP line)."""

    key: str
    name: str
    help: str


# The run's series, in the order `hpctl metrics` prints them; the dashboard (observability/dashboards) charts
# them by these names (tests/payloads/test_run_files.py holds it to them).
RUN_SERIES = (
    RunSeries("step", "hpl_train_step", "optimizer steps done"),
    RunSeries("max_steps", "hpl_train_max_steps", "optimizer steps the run will take"),
    RunSeries("loss", "hpl_train_loss", "training loss at the last log event"),
    RunSeries("learning_rate", "hpl_train_learning_rate", "learning rate at the last log event"),
    RunSeries(
        "tokens_per_second",
        "hpl_train_tokens_per_second",
        "real (non-padding) tokens per second over all data-parallel replicas",
    ),
    RunSeries("mfu", "hpl_train_mfu_ratio", "model FLOPs utilisation, 0 to 1"),
    RunSeries("reward", "hpl_train_reward", "GRPO: mean reward of the step's completions, reward functions summed"),
    RunSeries("kl", "hpl_train_kl", "GRPO: mean KL divergence of the policy from the base model"),
    RunSeries("completions/mean_length", "hpl_train_completion_length", "GRPO: mean completion length in tokens"),
    RunSeries("eta_seconds", "hpl_train_eta_seconds", "estimated seconds until the last step"),
    RunSeries("timestamp", "hpl_train_last_update_timestamp_seconds", "when these figures were written (Unix time)"),
)
RUN_SERIES_BY_KEY = {series.key: series for series in RUN_SERIES}
# GRPO: one series per reward function (trl logs rewards/<function>/mean), the function in its label
REWARD_FUNCTION_SERIES = RunSeries(
    "rewards/{function}/mean", "hpl_train_reward_function", "GRPO: mean reward of one reward function"
)
REWARD_FUNCTION_KEY = re.compile(r"rewards/(?P<function>[^/]+)/mean")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SAMPLE = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


def metric_value(value: float) -> str:
    """Prometheus text format: NaN and the infinities by name, everything else as Python's shortest repr."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class MetricSample:
    """One gauge: ``hpl_train_loss{run="demo",slurm_job_id="12"} NaN`` after its HELP and TYPE lines."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    help: str = ""

    def format(self) -> str:
        labels = ",".join(f'{key}="{_label_text(text)}"' for key, text in self.labels)
        sample = (
            f"{self.name}{{{labels}}} {metric_value(self.value)}"
            if labels
            else f"{self.name} {metric_value(self.value)}"
        )
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} gauge\n{sample}"


@dataclass(frozen=True)
class MetricsTextfile:
    """A whole .prom file: its samples in order."""

    samples: tuple[MetricSample, ...]

    def format(self) -> str:
        """HELP and TYPE once per series (one series may hold several samples: GRPO's per-function rewards)."""
        seen, lines = set(), []
        for sample in self.samples:
            text = sample.format()
            lines.append(text.splitlines()[-1] if sample.name in seen else text)
            seen.add(sample.name)
        return "".join(line + "\n" for line in lines)

    def values(self) -> dict[str, float]:
        return {sample.name: sample.value for sample in self.samples}

    @classmethod
    def parse(cls, text: str) -> MetricsTextfile:
        """Every sample line; a line neither comment nor sample is an error (node exporter would refuse the file)."""
        helps, samples = {}, []
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name, _, description = line[len("# HELP ") :].partition(" ")
                helps[name] = description
            elif line.startswith("#") or not line.strip():
                continue
            elif found := _SAMPLE.fullmatch(line):
                labels = tuple(
                    (key, re.sub(r"\\(.)", lambda escaped: _UNESCAPE.get(escaped[1], escaped[1]), raw))
                    for key, raw in _LABEL.findall(found["labels"] or "")
                )
                samples.append(MetricSample(found["name"], labels, float(found["value"]), helps.get(found["name"], "")))
            else:
                raise ValueError(f"not a Prometheus sample line: {line!r}")
        return cls(tuple(samples))


# -- <run>/logs/alerts.jsonl ------------------------------------------------------------------------------
ALERTS_FILE = "alerts.jsonl"  # beside the step logs
# The loss guard's error opens with this (training/loss_guard.py): a failed step whose log has it stopped on NaN.
NAN_STOP_OPENING = "training stopped: the "


@dataclass(frozen=True)
class AlertLine:
    """``{"time": "...", "run": "/fsx/outputs/run-a", "step": "train", "job": "12", "state": "failed",
    "detail": "..."}``: one alert as the run side raised it (``time``: UTC, ISO 8601)."""

    time: str
    run: str
    step: str
    job: str
    state: str
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    @property
    def subject(self) -> str:
        """The e-mail subject: SNS takes 100 characters at most."""
        return f"run {self.run.rstrip('/').rsplit('/', 1)[-1]}: {self.state} ({self.step})"[:100]

    @classmethod
    def parse_all(cls, text: str) -> list[AlertLine]:
        """Every well-formed line; a line cut off by a crash is skipped."""
        found = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                found.append(cls(**json.loads(line)))
        return found


# -- <run>/logs/recovery.jsonl and recovery.json ----------------------------------------------------------------
RECOVERY_FILE = "recovery.jsonl"  # beside the step logs: each attempt of a training step, each failure, each drill
RECOVERY_REPORT = "recovery.json"  # the recovery figures, written as the training step ends (jobs/recovery.py)
ATTEMPT, FAILURE, DRILL = "attempt", "failed", "drill"  # RecoveryLine.event


@dataclass(frozen=True)
class RecoveryLine:
    """``{"time": 1796588511.7, "event": "failed", "step": "train", "job": "12", "attempt": 1, ...}``: one event of a
    training step's life (``time``: seconds since the epoch, so figures subtract). ``offset``: the step log's size
    when the attempt started (its part of the log begins there); ``detail``: what failed, or the drill's fault."""

    time: float
    event: str
    step: str
    job: str
    attempt: int = 0
    nodes: str = ""
    offset: int = 0
    exit: int | None = None
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def parse_all(cls, text: str) -> list[RecoveryLine]:
        """Every well-formed line; a line cut off by a crash is skipped (as AlertLine's)."""
        return AlertLine.parse_all.__func__(cls, text)
