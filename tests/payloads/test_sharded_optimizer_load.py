"""The FSDP2 optimizer resume on hosts that share no disk: each rank holds only the .metadata and its
own file (a training job's host), yet loads the whole Adam state it saved, the replicated entries that
torch's save planner put in the other rank's file included (sharded_optimizer_probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("sharded_optimizer_probe.py")


def test_each_rank_resumes_its_adam_state_from_its_own_file_and_the_others_replicated_entries(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "payloads"), str(REPO)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(PROBE)]
    out = subprocess.run([*command, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert [rank["equal"] for rank in result["ranks"]] == [True, True]  # moments, steps, param groups
    assert result["lr"] == [0.123]  # the saved param group's lr, not the new optimizer's
    # both ranks needed entries from a file their host lacks (rank 0: most of them, in rank 1's file)
    assert all(rank["foreign"] > 0 for rank in result["ranks"]), result
