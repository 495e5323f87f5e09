"""cli.exit_step: a process with live gloo workers leaves without interpreter finalization, others as usual.

Each case runs in its own Python process: what is under test is how that process ends (exit status,
flushed output, whether atexit handlers and finalization ran).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PAYLOADS = Path(__file__).resolve().parents[2] / "payloads"

PROGRAM = """
import atexit, sys
import torch.distributed as dist
from llm_pipeline.cli import exit_step, gloo_workers_alive

atexit.register(lambda: print("finalized"))
print("before group", gloo_workers_alive())
if "{mode}" != "none":
    dist.init_process_group("gloo", init_method="file://{rendezvous}", rank=0, world_size=1)
    dist.barrier()  # a worker names itself when it starts: after a collective one has
    print("with group", gloo_workers_alive())
if "{mode}" == "destroyed":
    dist.destroy_process_group()  # nothing else holds it: torch joins its workers
    print("after destroy", gloo_workers_alive())
print("last line")  # block-buffered on a pipe: exit_step must flush it
exit_step(3)
"""


def run(mode: str, tmp_path: Path) -> subprocess.CompletedProcess:
    tmp_path.mkdir(exist_ok=True)
    program = textwrap.dedent(PROGRAM.format(mode=mode, rendezvous=tmp_path / "rendezvous"))
    env = {"PYTHONPATH": str(PAYLOADS), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)


def test_live_gloo_workers_leave_without_finalization(tmp_path):
    done = run("alive", tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["before group False", "with group True", "last line"]  # no "finalized"


def test_without_gloo_workers_the_process_exits_as_usual(tmp_path):
    for mode, seen in (("none", []), ("destroyed", ["with group True", "after destroy False"])):
        done = run(mode, tmp_path / mode)
        assert done.returncode == 3, done.stderr
        assert done.stdout.splitlines() == ["before group False", *seen, "last line", "finalized"]
