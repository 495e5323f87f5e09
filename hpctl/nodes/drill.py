"""`hpctl drill RUN --kill-rank | --fail-node`: the payload's fault drill (llm_pipeline.jobs.drill) on the
controller, over the same non-interactive SSM session the other controller commands use. The drill itself finds
the run's running train step and its first node; the recovery (llm_pipeline.jobs.recovery) writes the figures."""

from __future__ import annotations

import shlex

from hpctl.common.errors import HpctlError
from hpctl.common.run_progress import OUTPUTS_PREFIX
from hpctl.common.ssm import EXIT_MARKER, MarkedOutput
from llm_pipeline.run_files import RECOVERY_FILE, RECOVERY_REPORT

FAULTS = {
    "kill-rank": "SIGKILL one rank of the train step on its first node: the step starts again in its allocation",
    "fail-node": "mark the train step's first node FAIL, then DOWN: Slurm requeues the step onto the other nodes, "
    "and the node stays out of service until resumed",
}


def drill_command(fault: str, *, run_dir: str, payloads_dir: str) -> str:
    """One command line for the controller: the drill as root (scontrol update, srun into another user's job), in a
    login shell in the payloads folder, then its exit status after the marker."""
    drill = shlex.join(["python3", "-m", "llm_pipeline.jobs.drill", fault, "--run-dir", run_dir])
    script = f'cd {shlex.quote(payloads_dir)} && {drill}; echo "{EXIT_MARKER}$?"'
    return shlex.join(["sudo", "-n", "-H", "bash", "-lc", script])


class DrillOutput(MarkedOutput):
    """Echoes what the drill prints and keeps its exit status."""

    def check(self, session_rc: int) -> None:
        if self.exit_status is None:
            raise HpctlError(
                f"the session ended before the drill finished (aws exit {session_rc}): see the output above"
            )
        if self.exit_status != 0:
            raise HpctlError(f"the drill failed on the controller (exit {self.exit_status}): see its output above")


def where_figures_are(run: str, *, run_dir: str, bucket: str, fault: str) -> list[str]:
    logs = f"{run_dir}/logs"
    lines = [
        f"the recovery figures (time to detect, time to resume, steps lost, first step after) are written as the "
        f"train step ends: {logs}/{RECOVERY_REPORT} on FSx, s3://{bucket}/{OUTPUTS_PREFIX}{run}/logs/{RECOVERY_REPORT} "
        f"once exported; each attempt and failure is a line of {logs}/{RECOVERY_FILE}",
        f"follow the recovery: .venv/bin/hpctl events --run {run} --follow   (the recovered alert)",
        f"then: .venv/bin/hpctl logs steps {run} {RECOVERY_REPORT}",
    ]
    if fault == "fail-node":
        lines.append(
            "the failed node stays DOWN: resume it in `.venv/bin/hpctl shell` with "
            "`scontrol update nodename=<node> state=resume`, or reboot or replace it with `.venv/bin/hpctl node`"
        )
    return lines
