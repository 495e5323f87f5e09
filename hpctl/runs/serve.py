"""`hpctl serve RUN [--hours H] [--stop]`: the run's tuned model served by vLLM as a Slurm job on the run's partition
(llm_pipeline.jobs.serve_job on the controller, over the non-interactive SSM session the other controller commands
use), then reachable here through an SSM port forwarding session to the node's server via the controller."""

from __future__ import annotations

import json
import shlex

from hpctl.common.errors import HpctlError
from hpctl.common.ssm import EXIT_MARKER, MarkedOutput, PortForward
from llm_pipeline.jobs.serve_job import ENDPOINT_LINE
from llm_pipeline.serve import TUNED_NAME

DEFAULT_LOCAL_PORT = 8000


def serve_command(action: str, *, run_dir: str, payloads_dir: str, user: str, hours: float | None = None) -> str:
    """One command line for the controller: serve_job's submit or stop as the cluster user, in a login shell in the
    payloads folder, then its exit status after the marker."""
    argv = ["python3", "-m", "llm_pipeline.jobs.serve_job", action, "--run-dir", run_dir]
    if hours is not None:
        argv += ["--hours", f"{hours:g}"]
    script = f'cd {shlex.quote(payloads_dir)} && {shlex.join(argv)}; echo "{EXIT_MARKER}$?"'
    return shlex.join(["sudo", "-n", "-u", user, "-H", "bash", "-lc", script])


class ServeOutput(MarkedOutput):
    """Echoes what serve_job prints; keeps its exit status and the endpoint line (host:port and job id)."""

    def __init__(self) -> None:
        super().__init__()
        self.endpoint: tuple[str, int] | None = None
        self.job = ""

    def read(self, line: str) -> None:
        if line.startswith(ENDPOINT_LINE):
            address, self.job = line.removeprefix(ENDPOINT_LINE).split()
            host, port = address.rsplit(":", 1)
            self.endpoint = (host, int(port))

    def check(self, session_rc: int, action: str) -> None:
        if self.exit_status is None:
            raise HpctlError(
                f"the session ended before serve {action} finished (aws exit {session_rc}): see the output above"
            )
        if self.exit_status != 0:
            raise HpctlError(f"serve {action} failed on the controller (exit {self.exit_status}): see its output above")
        if action == "submit" and self.endpoint is None:
            raise HpctlError("the serve job printed no endpoint: see the output above")


def forward(endpoint: tuple[str, int], local_port: int) -> PortForward:
    host, port = endpoint
    return PortForward(host=host, port=port, local_port=local_port)


def how_to_call(run: str, job: str, local_port: int) -> list[str]:
    url = f"http://127.0.0.1:{local_port}/v1"
    body = json.dumps({"model": TUNED_NAME, "prompt": "Hello", "max_tokens": 32})
    return [
        f"serving run {run} (Slurm job {job}) at {url} while this session forwards port {local_port} (Ctrl-C ends "
        f"the forwarding; the job runs on until its time limit or `hpctl serve --stop {run}`)",
        f"curl -s {url}/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}",
    ]
