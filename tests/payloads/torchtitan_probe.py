"""Runs inside the torchtitan 0.2.2 folder (.venv/torchtitan-site) for the ladder tests; prints JSON.

    python torchtitan_probe.py parse JOB.toml...   each file through torchtitan's ConfigManager, as
                                                   `python -m torchtitan.train --job.config_file` does
                                                   (a refused file answers {"error": ...}), then its
                                                   custom import and the flavor's train spec lookup
    python torchtitan_probe.py metrics             metric lines printed by torchtitan's own
                                                   MetricsProcessor.log, with the figures it computed

For `metrics`, only the GPU memory reading is supplied (DeviceMemoryMonitor needs CUDA); the line
itself, its format and every other figure come from torchtitan's code.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import time


def parse(paths: list[str]) -> list[dict]:
    import importlib

    from torchtitan.config import ConfigManager
    from torchtitan.protocols import model_converter, train_spec

    results = []
    for path in paths:
        try:
            job = ConfigManager().parse_args(["--job.config_file", path])
        except (Exception, SystemExit) as exc:  # tyro exits on a value it cannot read
            results.append({"path": path, "error": f"{type(exc).__name__}: {exc}"})
            continue
        if job.experimental.custom_import:  # as torchtitan's Trainer does before the train spec lookup
            importlib.import_module(job.experimental.custom_import)
        results.append(
            {
                "path": path,
                "config": job.to_dict(),
                "flavor_known": job.model.flavor in train_spec.get_train_spec(job.model.name).model_args,
                "unknown_converters": [
                    name for name in job.model.converters if name not in model_converter._registry_model_converter_cls
                ],
            }
        )
    return results


class CapturingLogger:
    """A metrics backend (TensorBoard's place) that keeps what MetricsProcessor computed."""

    def __init__(self) -> None:
        self.logged: list[dict] = []

    def log(self, metrics: dict, step: int) -> None:
        self.logged.append({"step": step, **metrics})

    def close(self) -> None:
        pass


class FixedMemory:
    """Peak device memory as DeviceMemoryMonitor reports it on a GPU (CUDA cannot run here)."""

    def __init__(self, stats) -> None:
        self.stats = stats

    def get_peak_stats(self):
        return self.stats

    def reset_peak_stats(self) -> None:
        pass


def metrics() -> dict:
    from torchtitan.components.metrics import DeviceMemStats, MetricsProcessor
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.tools import utils
    from torchtitan.tools.logging import init_logger, logger

    init_logger()
    stream = io.StringIO()
    logger.handlers[0].setStream(stream)
    results = []
    for colors in (False, True):
        job = JobConfig()
        job.metrics.log_freq = 10
        job.metrics.disable_color_printing = not colors
        processor = MetricsProcessor.__new__(MetricsProcessor)  # __init__ would query the CUDA device
        capture = CapturingLogger()
        processor.logger = capture
        processor.job_config = job
        processor.parallel_dims = ParallelDims(
            dp_replicate=1, dp_shard=32, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=32
        )
        processor.color = utils.Color() if colors else utils.NoColor()
        processor.gpu_peak_flops = utils.get_peak_flops("NVIDIA H100 80GB HBM3")
        processor.num_flops_per_token = 6 * 8_000_000_000
        processor.device_memory_monitor = FixedMemory(DeviceMemStats(58.2, 73.5, 61.05, 77.17, 0, 0))
        # (step, loss, grad norm, tokens this rank saw since the last line, seconds since it)
        for step, loss, grad_norm, tokens, seconds in (
            (1, 12.25, 8.5, 8_192, 30.0),
            (10, 9.87654, 1.2345, 81_920, 12.65),
        ):
            processor.ntokens_since_last_log = tokens
            processor.data_loading_times = [0.01]
            processor.time_last_log = time.perf_counter() - seconds
            processor.log(step, loss, loss + 0.5, grad_norm)
        processor.ntokens_since_last_log = 65_536
        processor.log_validation(9.5, 10)  # a validation line: not a training metric line
        results.append({"colors": colors, "logged": capture.logged})
    return {"lines": stream.getvalue(), "runs": results}


def main(argv: list[str]) -> int:
    with contextlib.redirect_stdout(sys.stderr):  # torchtitan logs to stdout: keep stdout for the JSON
        logging.getLogger().setLevel(logging.WARNING)
        result = parse(argv[1:]) if argv[0] == "parse" else metrics()
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
