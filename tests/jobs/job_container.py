"""A SageMaker training container's folders and variables, laid out under a temp root (no Docker).

What SageMaker and the SDK's container driver give a job's process, in the same shape:
<root>/input/config/resourceconfig.json, one folder per input channel under <root>/input/data/
(the code channel holds the staged source, the working folder of the job's command), <root>/model,
<root>/output/data, <root>/checkpoints, and the SM_* variables naming them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Container:
    root: Path  # stands for /opt/ml
    host: str
    hosts: tuple[str, ...]

    @property
    def code_dir(self) -> Path:
        return self.channel("code")

    def channel(self, name: str) -> Path:
        return self.root / "input" / "data" / name

    def environment(self, job_environment: dict[str, str], *, job_name: str, channels: list[str]) -> dict[str, str]:
        """This machine's PATH and basics, the job's Environment, then what the container driver exports."""
        base = {key: value for key, value in os.environ.items() if not key.startswith(("HPL_", "SM_", "SLURM_"))}
        base.pop("PYTHONPATH", None)
        driver = {
            "TRAINING_JOB_NAME": job_name,
            "SM_HOSTS": json.dumps(list(self.hosts)),
            "SM_CURRENT_HOST": self.host,
            "SM_HOST_COUNT": str(len(self.hosts)),
            "SM_CURRENT_HOST_RANK": str(sorted(self.hosts).index(self.host)),
            "SM_MASTER_ADDR": "algo-1",
            "SM_MASTER_PORT": "7777",
            "SM_MODEL_DIR": str(self.root / "model"),
            "SM_INPUT_DIR": str(self.root / "input"),
            "SM_INPUT_DATA_DIR": str(self.root / "input" / "data"),
            "SM_INPUT_CONFIG_DIR": str(self.root / "input" / "config"),
            "SM_OUTPUT_DIR": str(self.root / "output"),
            "SM_OUTPUT_DATA_DIR": str(self.root / "output" / "data"),
            "SM_CHANNELS": json.dumps(channels),
            "SM_NUM_GPUS": "0",
            "SM_NUM_NEURONS": "0",
            **{f"SM_CHANNEL_{name.upper()}": str(self.channel(name)) for name in channels},
        }
        return {**base, **job_environment, **driver}


def lay_out(root: Path, *, host: str = "algo-1", hosts: tuple[str, ...] = ("algo-1",)) -> Container:
    for folder in ("input/config", "input/data/code", "model", "output/data", "checkpoints"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    resource_config = {
        "current_host": host,
        "current_instance_type": "ml.m5.xlarge",
        "current_group_name": "homogeneousCluster",
        "hosts": list(hosts),
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "hosts": list(hosts)}],
        "network_interface_name": "eth0",
    }
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps(resource_config))
    return Container(root=root, host=host, hosts=hosts)
