"""Runs pytest once per job, each in a fresh process forked from this one after it imported the libraries the
focused tests load (torch, transformers, peft, trl): what each job's own interpreter would import again.

    python mutation_runner.py JOBS.json   (a list of {"pythonpath": ..., "args": [...], "log": ...})

A job's process imports llm_pipeline itself, from the pythonpath it is given (this process never imports it);
its output goes to its log; this process prints the jobs' exit statuses as a JSON list.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

PRELOAD = ("torch", "transformers", "peft", "trl")


def run_job(job: dict) -> None:
    """The forked process's body: never returns."""
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)  # sys.stdout and sys.stderr write to these descriptors
    status = 3
    try:
        import pytest

        status = int(pytest.main(["-o", f"pythonpath={job['pythonpath']}", *job["args"]]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # no cleanup of what the parent holds


def main(jobs_file: str) -> int:
    assert "llm_pipeline" not in sys.modules
    for name in PRELOAD:
        importlib.import_module(name)
    assert "llm_pipeline" not in sys.modules, "a preloaded library imported llm_pipeline: jobs would not see their copy"
    statuses = []
    for job in json.loads(Path(jobs_file).read_text()):
        sys.stdout.flush()  # nothing buffered here is written again by the child
        child = os.fork()
        if child == 0:
            run_job(job)
        _, wait_status = os.waitpid(child, 0)
        statuses.append(os.waitstatus_to_exitcode(wait_status))
    print(json.dumps(statuses))
    return 0


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m pytest` run there has it, not this file's folder
    sys.exit(main(sys.argv[1]))
