"""Session Manager sessions through the AWS CLI (boto3 cannot drive the session's websocket).

`aws ssm start-session` needs two local programs: the AWS CLI and the session-manager-plugin it
hands the session to. Both are looked up on PATH, as the CLI itself does, before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from hpctl.common.errors import HpctlError

PLUGIN = "session-manager-plugin"
CLI_INSTALL_URL = "https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html"
PLUGIN_INSTALL_URL = (
    "https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html"
)
# Runs one command on the node without a terminal; the agent splits it like a POSIX shell
# (no shell runs it), so anything shell-like goes inside an explicit `bash -c`.
NON_INTERACTIVE_DOCUMENT = "AWS-StartNonInteractiveCommand"
# The session's own exit status is the CLI's, not the command's: a command echoes its status after this marker.
EXIT_MARKER = "hpctl-remote-exit="
EXIT_LINE = re.compile(re.escape(EXIT_MARKER) + r"(?P<status>\d+)$")
# Forwards a local port through the target (the controller) to a host:port it reaches (a compute node's server).
PORT_FORWARD_DOCUMENT = "AWS-StartPortForwardingSessionToRemoteHost"


@dataclass(frozen=True)
class PortForward:
    host: str  # as the target reaches it
    port: int
    local_port: int

    def parameters(self) -> dict[str, list[str]]:
        return {"host": [self.host], "portNumber": [str(self.port)], "localPortNumber": [str(self.local_port)]}


@dataclass(frozen=True)
class SessionRequest:
    target: str
    region: str
    profile: str | None = None
    command: str | None = None  # None: an interactive shell
    forward: PortForward | None = None  # a port forwarding session instead of a shell or command

    def argv(self) -> list[str]:
        argv = ["aws", "ssm", "start-session", "--target", self.target, "--region", self.region]
        if self.profile:
            argv += ["--profile", self.profile]
        if self.forward is not None:
            argv += ["--document-name", PORT_FORWARD_DOCUMENT, "--parameters", json.dumps(self.forward.parameters())]
        elif self.command is not None:
            argv += [
                "--document-name",
                NON_INTERACTIVE_DOCUMENT,
                "--parameters",
                json.dumps({"command": [self.command]}),
            ]
        return argv


def find_session_tools() -> str:
    """The AWS CLI's path; a clear error when it or the Session Manager plugin is missing."""
    aws = shutil.which("aws")
    if aws is None:
        raise HpctlError(f"the AWS CLI (`aws`) is not on PATH: install AWS CLI v2 ({CLI_INSTALL_URL})")
    if shutil.which(PLUGIN) is None:
        raise HpctlError(
            f"the Session Manager plugin (`{PLUGIN}`) is not on PATH; "
            f"`aws ssm start-session` needs it: install it ({PLUGIN_INSTALL_URL})"
        )
    return aws


def exec_session(request: SessionRequest) -> NoReturn:
    """Replace this process with the session, so the terminal and Ctrl-C belong to it."""
    aws = find_session_tools()
    argv = request.argv()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(aws, argv)


def run_session(request: SessionRequest, on_line: Callable[[str], None]) -> int:
    """Run a non-interactive session, handing each output line (without line ending) to ``on_line``."""
    aws = find_session_tools()
    argv = request.argv()
    with subprocess.Popen(argv, executable=aws, stdout=subprocess.PIPE, text=True, errors="replace") as process:
        assert process.stdout is not None
        for line in process.stdout:
            on_line(line.rstrip("\r\n").replace("\r", ""))
    return process.returncode


def forward_port(request: SessionRequest) -> int:
    """Hold a port forwarding session open until it ends or Ctrl-C; the CLI's exit status."""
    aws = find_session_tools()
    try:
        return subprocess.run(request.argv(), executable=aws, check=False).returncode
    except KeyboardInterrupt:
        return 0  # the user closed the forwarding: what they asked for


class MarkedOutput:
    """A session's output handler for a command that echoes EXIT_MARKER: echoes each line, keeps the status."""

    def __init__(self) -> None:
        self.exit_status: int | None = None

    def __call__(self, line: str) -> None:
        marker = EXIT_LINE.search(line)
        if marker:  # output without a final newline shares the marker's line
            self.exit_status = int(marker["status"])
            line = line[: marker.start()]
            if not line:
                return
        print(line, flush=True)
        self.read(line)

    def read(self, line: str) -> None:
        """What a subclass takes from an echoed line."""
