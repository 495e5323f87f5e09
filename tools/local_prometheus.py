"""A throwaway Prometheus and node exporter on this host, as a node runs them (Debian's packages, installed by
tools/system_packages.sh): node exporter's textfile collector reads one folder (where the run's metrics land,
HPL_METRICS_TEXTFILE_PATH), Prometheus scrapes it every second. Used by `make rehearse` and tests/slurm.

    with LocalPrometheus(Path("/tmp/x")) as prometheus:
        ... write *.prom files into prometheus.textfile ...
        prometheus.wait_for('<a run series>{run="tiny"}')

`epilog_conf` gives a local Slurm the lifecycle's epilog; `sweep_once` is one run of the node's sweep timer.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_METRICS = REPO / "lifecycle" / "slurm_metrics.py"
BINARIES = ("prometheus", "prometheus-node-exporter")
SCRAPE_INTERVAL = "1s"


class LocalPrometheusError(RuntimeError):
    """Prometheus or node exporter could not start; the message says what is missing or which log to read."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class LocalPrometheus:
    def __init__(self, root: Path, *, node_exporter_args: tuple[str, ...] = ("--no-collector.infiniband",)) -> None:
        self.root = Path(root)
        self.textfile = self.root / "textfile"  # node exporter's textfile collector folder
        self.node_exporter_args = node_exporter_args
        self.exporter_port = self.port = 0
        self._processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalPrometheus:
        missing = [tool for tool in BINARIES if not shutil.which(tool)]
        if missing:
            raise LocalPrometheusError(f"missing {', '.join(missing)}: tools/system_packages.sh installs them")
        self.textfile.mkdir(parents=True, exist_ok=True)
        self.textfile.chmod(0o1777)  # the jobs' user writes the run's metrics here, as on a node
        self.exporter_port, self.port = free_port(), free_port()
        config = self.root / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  external_labels:\n    cluster: rehearsal\n"
            "scrape_configs:\n  - job_name: node\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{self.exporter_port}']\n"
        )
        self._spawn(
            "node-exporter",
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{self.exporter_port}",
             f"--collector.textfile.directory={self.textfile}", *self.node_exporter_args],
        )  # fmt: skip
        self._spawn(
            "prometheus",
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{self.exporter_port}/metrics")
            wait_http(f"{self.url}/-/ready")
        except OSError as error:
            raise LocalPrometheusError(f"not answering ({error}): see the logs in {self.root}") from error
        return self

    def stop(self) -> None:
        """Stop what start() spawned, by PID, newest first."""
        while self._processes:
            process = self._processes.pop()
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> LocalPrometheus:
        with ExitStack() as on_failure:
            on_failure.callback(self.stop)
            self.start()
            on_failure.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f"{name}.log").open("w") as log:
            # Its own session: a terminal's Ctrl-C reaches the rehearsal alone, which queries it once more if it
            # must and stops it (stop()); Prometheus killed by the same Ctrl-C would turn that into a traceback.
            self._processes.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            )

    # -- PromQL --------------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise LocalPrometheusError(f"{expr}: {body.get('error', body)}")
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not (found := self.query(expr)):
            if time.monotonic() > deadline:
                raise LocalPrometheusError(f"no series for {expr} within {timeout:.0f} s")
            time.sleep(0.5)
        return found

    def wait_until_empty(self, expr: str, timeout: float = 60) -> float:
        """Seconds until ``expr`` returns nothing."""
        start = time.monotonic()
        while self.query(expr):
            if time.monotonic() - start > timeout:
                raise LocalPrometheusError(f"{expr} still has series after {timeout:.0f} s")
            time.sleep(0.5)
        return time.monotonic() - start


def epilog_conf(prometheus: LocalPrometheus, folder: Path) -> tuple[str, ...]:
    """slurm.conf lines for a local Slurm whose epilog removes an ended job's run metrics, as the lifecycle's does
    on a node (an Epilog folder glob, the epilog from slurm_metrics.py epilog-script)."""
    folder.mkdir(parents=True, exist_ok=True)
    epilog = folder / "hpl-run-metrics.sh"
    epilog.write_text(
        subprocess.run(
            [sys.executable, str(SLURM_METRICS), "epilog-script", str(prometheus.textfile), sys.executable,
             str(SLURM_METRICS)],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    epilog.chmod(0o755)
    return (f"Epilog={folder}/*",)


def sweep_once(textfile: Path, env: Mapping[str, str], node: str) -> None:
    """One run of the node's sweep timer against the local Slurm (``env`` has its SLURM_CONF)."""
    subprocess.run(
        [sys.executable, str(SLURM_METRICS), "sweep", str(textfile), node], env=dict(env), check=True, timeout=30
    )
