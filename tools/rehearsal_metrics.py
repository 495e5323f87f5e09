"""The rehearsal's observability: Prometheus and node exporter beside its local Slurm (tools/local_prometheus.py),
the lifecycle's epilog in that Slurm, the node's timers (slurm_metrics.py sweep and cluster) while the pipeline
runs, and at the end every dashboard query evaluated on the run and the dashboard's panels drawn from it.

    metrics = RehearsalMetrics(root / "prometheus")
    with metrics, LocalSlurm(root / "slurm", extra_conf=metrics.slurm_conf()) as slurm:
        env = metrics.environment(slurm.env(...))
        with metrics.node_timers(env, slurm.node_names[0]):
            ... submit and wait ...
        loss_arrived = metrics.report(run, started, time.time())
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_pipeline.run_files import RUN_SERIES_BY_KEY
from tools import dashboard_chart
from tools.local_prometheus import SLURM_METRICS, LocalPrometheus, epilog_conf

TEXTFILE_ENV = "HPL_METRICS_TEXTFILE_PATH"  # llm_pipeline.jobs.prom_textfile.FOLDER_ENV
LOSS, STEP = RUN_SERIES_BY_KEY["loss"].name, RUN_SERIES_BY_KEY["step"].name
TIMER_SECONDS = 5.0  # the node's sweep runs every 15 s, the controller's Slurm collector every 30 s


def loss_promql(run: str) -> str:
    """One PromQL line that shows the run's loss, also after the run (its series end with the job)."""
    return f'last_over_time({LOSS}{{run="{run}"}}[1h])'


class RehearsalMetrics:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.prometheus = LocalPrometheus(self.root)

    def __enter__(self) -> RehearsalMetrics:
        self.prometheus.__enter__()
        print(f"[metrics] Prometheus answers at {self.prometheus.url} while the rehearsal runs", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.prometheus.stop()

    def slurm_conf(self) -> tuple[str, ...]:
        return epilog_conf(self.prometheus, self.root / "epilog.d")

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, TEXTFILE_ENV: str(self.prometheus.textfile)}

    @contextmanager
    def node_timers(self, env: dict[str, str], node: str) -> Iterator[None]:
        """The node's sweep and the controller's Slurm collector, every TIMER_SECONDS, while the block runs; like a
        systemd timer, a failed run is reported and the next one runs anyway."""
        stop = threading.Event()
        commands = (("sweep", str(self.prometheus.textfile), node), ("cluster", str(self.prometheus.textfile)))

        def loop() -> None:
            while not stop.is_set():
                for command in commands:
                    # its own session: a Ctrl-C meant for the rehearsal would print this run's traceback
                    done = subprocess.run(
                        [sys.executable, str(SLURM_METRICS), *command], env=env, timeout=30, start_new_session=True
                    )
                    if done.returncode:
                        print(f"[metrics] slurm_metrics.py {command[0]} exited {done.returncode}", flush=True)
                stop.wait(TIMER_SECONDS)

        thread = threading.Thread(target=loop, name="hpl-node-timers", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=60)

    def evaluate_dashboard(self, run: str, start: float, end: float) -> dict[str, int]:
        """Every dashboard query over the run's time, ``$run`` set to it: panel title -> points returned."""
        panels = json.loads(dashboard_chart.DASHBOARD.read_text())["panels"]
        points = {}
        for panel in panels:
            points[panel["title"]] = sum(
                len(series["values"])
                for target in panel["targets"]
                for series in dashboard_chart.query_range(
                    self.prometheus.url, target["expr"].replace("$run", run).replace("$job", ".*"), start, end
                )
            )
        return points

    def report(self, run: str, start: float, end: float) -> bool:
        """Print what the dashboard shows of the run and the loss Prometheus holds, draw the panels (PNG); whether
        the run's loss reached Prometheus."""
        print(f"\n[metrics] the dashboard's queries on run {run} ({dashboard_chart.DASHBOARD.name}):")
        for title, count in self.evaluate_dashboard(run, start, end).items():
            print(f"  {title:<42} {f'{count} points' if count else 'no data on this host'}")
        losses = dashboard_chart.query_range(self.prometheus.url, f'{LOSS}{{run="{run}"}}', start, end)
        steps = dashboard_chart.query_range(self.prometheus.url, f'{STEP}{{run="{run}"}}', start, end)
        if losses and steps:
            by_time = dict(steps[0]["values"])
            pairs = sorted({(int(float(by_time[t])), float(v)) for t, v in losses[0]["values"] if t in by_time})
            print("  loss by step, from Prometheus: " + ", ".join(f"{step}: {loss:.4f}" for step, loss in pairs))
        chart = self.root.parent / "observability.png"
        dashboard_chart.draw(self.prometheus.url, start, end, chart, run=run)
        print(f"[metrics] the run's loss in PromQL (at {self.prometheus.url}): {loss_promql(run)}")
        print(f"[metrics] the dashboard's panels drawn from this run: {chart} (docs/observability.png is one)")
        print(
            f"[metrics] to query it again later: prometheus --config.file={self.root / 'prometheus.yml'} "
            f"--storage.tsdb.path={self.root / 'tsdb'}"
        )
        return bool(losses)
