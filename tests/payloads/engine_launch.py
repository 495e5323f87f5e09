"""The torch engine in its own processes, as torchrun starts it on a node: 1 or 2 gloo ranks training
run configs through tests/payloads/torch_engine_probe.py, with the main environment's libraries (the
CUDA image's pins) and this checkout's payload package first on the path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The production precision runs (bf16, FSDP2): test_train_precision.py's, and the runs without liger that
# test_liger_fsdp.py holds liger's to (one 2-rank launch serves both).
PRECISION_METHODS = ("lora", "dora", "qlora", "full")
PRECISION_STEPS = 4
PRECISION_GLOBAL_BATCH = 4
PROBE = Path(__file__).with_name("torch_engine_probe.py")
LEAKED_PREFIXES = ("ACCELERATE_", "FSDP_")  # process-wide settings an in-process Trainer exported


def engine_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a rank starts with: no settings an earlier in-process Trainer left behind."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(LEAKED_PREFIXES)}
    paths = [str(REPO / "payloads"), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_engine(
    run_configs: list[Path], out: Path, *, ranks: int, timeout: float = 600, liger_standin: bool = False
) -> dict[str, dict]:
    """Train each run config in turn with the torch engine on ``ranks`` gloo processes (one launch);
    the probe's answer per config file stem. ``liger_standin``: liger's kernels as torch references."""
    probe = [str(PROBE), *(f"--config={path}" for path in run_configs), "--out", str(out)]
    probe += ["--liger-standin"] if liger_standin else []
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command = (launch if ranks > 1 else [sys.executable]) + probe
    done = subprocess.run(command, env=engine_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def write_precision_run(folder: Path, env: dict[str, str], method: str, ranks: int, **train) -> Path:
    """tiny-cpu.toml with the production precision, ``ranks`` FSDP2 ranks and the same global batch, its data
    prepared (several ranks need the data step first); ``train`` adds keys (liger_kernel) and names the run."""
    from payload_configs import write_config

    from llm_pipeline import config, data

    name = "-".join([method, *(f"{key}_{value}" for key, value in train.items()), str(ranks)])
    path = write_config(
        folder / f"{name}.toml",
        env,
        train={
            "method": method,
            "bf16": True,
            "max_steps": PRECISION_STEPS,
            "logging_steps": 1,
            "per_device_batch_size": PRECISION_GLOBAL_BATCH // ranks,
            # full fine-tuning at the default learning rate: most bf16 weights would not move
            "learning_rate": 2e-5 if method == "full" else 5e-3,
            **train,
        },
        data={"validation_fraction": 0.0, "max_samples": 48},
        paths={"output_dir": str(folder / name)},
        parallel={"strategy": "fsdp", "nodes": ranks},
    )
    data.prepare(config.load(path, env=env))
    return path
