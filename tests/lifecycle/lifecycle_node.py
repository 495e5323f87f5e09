"""A fake HyperPod node for lifecycle/on_init_complete.sh.

The real script runs from a copy of lifecycle/ (as HyperPod downloads it, with cluster-facts.json
beside it) against a temporary root (LIFECYCLE_ROOT). The node's system commands that tell about
or change the machine (hostname, mountpoint, id, chown, neuron-ls, enroot, nvidia-smi, and Slurm's
sinfo, scontrol, slurmd, slurmctld) are recorders on PATH:
each logs its call, then answers like the real one from the test's settings. chown really changes
ownership (the tests run as root, like the script on a node).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LIFECYCLE_DIR = Path(__file__).resolve().parents[2] / "lifecycle"
USER_ID = 4242  # the default user's uid and gid on the fake node
# The node's python3, which the scripts run their helpers with: the distribution's, as on the AMI, not whatever a
# developer's PATH puts first (a pyenv shim starts about 40 bash processes before Python: 0.1 CPU-s a call, and the
# scripts make hundreds of calls in this suite).
NODE_PYTHON = Path("/usr/bin/python3")

FACTS = {
    "cluster_name": "lora-test",
    "region": "us-west-2",
    "bucket": "sagemaker-lora-test-bucket",
    "image_uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/lora:abc123",
    "fsx_mount_path": "/fsx",
    "payloads_dir": "/fsx/payloads",
    "datasets_dir": "/fsx/datasets",
    "outputs_dir": "/fsx/outputs",
    "models_dir": "/fsx/models",
    "compile_cache_dir": "/fsx/neuron-cache",
    "images_dir": "/fsx/images",
    "scratch_dir": "/fsx/scratch",
    "controller_group": "controller",
    "login_group": "login",
    "compute_groups": "trn1,gpu",
    "compute_group": "trn1",
    "partition": "trn1",
    "default_partition": "trn1",
    "default_user": "ubuntu",
    "accelerator": "neuron",
    "devices_per_node": 32,
    "efa_interfaces": 8,
    "efa_device_rdma": 1,
    "compute_instance_type": "ml.trn1.32xlarge",
    "runtime": "pyxis",
    "observability": "off",  # test_lifecycle_observability.py turns it on
    "metrics_remote_write_url": "",
    "metrics_textfile_path": "",
    "node_exporter_image": "",
    "collector_image": "",
    "dcgm_exporter_image": "",
    "hf_token_secret_arn": "arn:aws:secretsmanager:us-west-2:123456789012:secret:hpl-hub-token-AbCdEf",
    "alerts_topic_arn": "arn:aws:sns:us-west-2:123456789012:hyperpod-lora-alerts",
    "alert_stall_minutes": 30,
    "partitions": {
        "trn1": {
            "group": "trn1",
            "partition": "trn1",
            "instance_type": "ml.trn1.32xlarge",
            "count": 4,
            "accelerator": "neuron",
            "devices_per_node": 32,
            "efa_interfaces": 8,
            "efa_device_rdma": 1,
            "image_uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/lora:abc123",
            "capacity": "on-demand",
            "training_plan_arn": "",
        },
        "p5": {
            "group": "gpu",
            "partition": "p5",
            "instance_type": "ml.p5.48xlarge",
            "count": 2,
            "accelerator": "cuda",
            "devices_per_node": 8,
            "efa_interfaces": 32,
            "efa_device_rdma": 1,
            "image_uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/lora:cuda456",
            "capacity": "spot",
            "training_plan_arn": "",
        },
    },
}

FLAT_NAMES = {"group": "compute_group", "instance_type": "compute_instance_type"}


def expected_profile(group: str = "") -> dict[str, str]:
    """HPL_* a node of `group` exports: the scalar facts, its own partition's facts on a compute node."""
    facts = {key: value for key, value in FACTS.items() if key != "partitions"}
    for partition in FACTS["partitions"].values():
        if partition["group"] == group:
            facts.update({FLAT_NAMES.get(k, k): v for k, v in partition.items() if k != "count"})
    facts["cluster_facts_file"] = "/etc/hyperpod-lora/cluster-facts.json"  # every partition, for submit
    return {f"HPL_{key.upper()}": str(value) for key, value in facts.items()}


# Group -> [(instance name, customer IP)], shaped like a cluster with a login group and 4 workers.
CLUSTER = {
    "controller": [("controller-1", "10.1.0.10")],
    "login": [("login-1", "10.1.0.20")],
    "trn1": [(f"trn1-{i}", f"10.1.1.{i}") for i in range(1, 5)],
    "gpu": [(f"gpu-{i}", f"10.1.2.{i}") for i in range(1, 3)],
}
CONTROLLER_IP, LOGIN_IP = "10.1.0.10", "10.1.0.20"
COMPUTE_IPS = [ip for _, ip in CLUSTER["trn1"]]
GPU_IPS = [ip for _, ip in CLUSTER["gpu"]]
INSTANCE_TYPES = {
    "controller": "ml.m5.xlarge",
    "login": "ml.m5.xlarge",
    "trn1": "ml.trn1.32xlarge",
    "gpu": "ml.p5.48xlarge",
}

RECORDERS = {
    "hostname": 'if [[ "${1:-}" == -I ]]; then echo "$FAKE_NODE_IPS "; else echo ip-fake-node; fi',
    "mountpoint": '[[ " $FAKE_MOUNTPOINTS " == *" ${*: -1} "* ]]',
    "id": """IFS=: read -r name uid gid <<<"$FAKE_USER"
[[ "${2:-}" == "$name" ]] || { echo "id: '${2:-}': no such user" >&2; exit 1; }
case "$1" in -u) echo "$uid" ;; -g) echo "$gid" ;; *) exit 2 ;; esac""",
    "chown": 'exec "$REAL_CHOWN" "$@"',
    "neuron-ls": 'echo "instance-type: trn1.32xlarge"; echo "NEURON DEVICES: 16  NEURON CORES: 32"',
    "enroot": "echo 3.5.0",
    # FAKE_GPUS GPUs (default 8), or a failure with FAKE_NVIDIA_SMI_EXIT.
    "nvidia-smi": """if [[ -n "${FAKE_NVIDIA_SMI_EXIT:-}" ]]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit "$FAKE_NVIDIA_SMI_EXIT"
fi
for ((i = 0; i < ${FAKE_GPUS:-8}; i++)); do echo "$i, NVIDIA H100 80GB HBM3, 81559 MiB"; done""",
    # Containers and units as state files (outside the node's root): "<hpl.spec label> true" per container.
    "docker": """case "$1" in
  inspect) [[ -f "$FAKE_STATE/docker/${*: -1}" ]] && exec cat "$FAKE_STATE/docker/${*: -1}"
           echo "Error: No such object: ${*: -1}" >&2; exit 1 ;;
  run) while (($#)); do
         case "$1" in --name) name="$2" ;; --label) [[ "$2" == hpl.spec=* ]] && spec="${2#hpl.spec=}" ;; esac
         shift
       done
       mkdir -p "$FAKE_STATE/docker"; echo "$spec true" >"$FAKE_STATE/docker/$name"; echo c0ffee ;;
  rm) rm -f "$FAKE_STATE/docker/${*: -1}" ;;
  login) cat >/dev/null ;;
esac""",
    "systemctl": """case "$1" in
  is-active) [[ -f "$FAKE_STATE/units/${*: -1}" ]] ;;
  restart) mkdir -p "$FAKE_STATE/units"; touch "$FAKE_STATE/units/$2" ;;
  enable) [[ "$2" == --now ]] && { mkdir -p "$FAKE_STATE/units"; touch "$FAKE_STATE/units/$3"; } || true ;;
esac""",
    # The AMI's Slurm: FAKE_SLURM_VERSION (default 25.11.2); the commands named in FAKE_SLURM_FAIL fail
    # like a client with no configuration source.
    **{
        name: f"""if [[ " ${{FAKE_SLURM_FAIL:-}} " == *" {name} "* ]]; then
  echo "{name}: fatal: Could not establish a configuration source" >&2; exit 1
fi
echo "slurm ${{FAKE_SLURM_VERSION:-25.11.2}}"
"""
        for name in ("sinfo", "scontrol", "slurmd", "slurmctld")
    },
    "aws": "echo fake-ecr-token",
    "neuron-monitor": "sleep 0",
    "neuron-monitor-prometheus.py": "sleep 0",
}


def resource_config(cluster: dict[str, list[tuple[str, str]]] = CLUSTER) -> dict:
    """The shape HyperPod writes to /opt/ml/config/resource_config.json."""
    groups = []
    for group, instances in cluster.items():
        groups.append(
            {
                "Name": group,
                "InstanceType": INSTANCE_TYPES.get(group, "ml.m5.xlarge"),
                "Instances": [
                    {
                        "InstanceName": name,
                        "InstanceId": f"i-0{index:016x}",
                        "AgentIpAddress": f"172.16.0.{index}",
                        "CustomerIpAddress": ip,
                    }
                    for index, (name, ip) in enumerate(instances, start=len(groups) * 10 + 1)
                ],
            }
        )
    return {
        "ClusterConfig": {
            "ClusterArn": "arn:aws:sagemaker:us-west-2:123456789012:cluster/abc123def456",
            "ClusterName": FACTS["cluster_name"],
        },
        "InstanceGroups": groups,
    }


# The controller's slurm.conf as HyperPod writes it for this cluster, without topology.
SLURM_CONF = """ClusterName=lora-test
SlurmctldHost=ip-10-1-0-10
SelectType=select/cons_tres
NodeName=ip-10-1-1-[1-4] CPUs=128 State=CLOUD
PartitionName=trn1 Nodes=ip-10-1-1-[1-4] Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    calls: list[str]  # the recorded system commands, "name arg arg"

    def called(self, name: str) -> list[str]:
        return [call for call in self.calls if call.split(" ", 1)[0] == name]


class FakeNode:
    """One node: its own root (/etc, /dev, /opt, /fsx) and a copy of the uploaded lifecycle folder."""

    def __init__(
        self,
        base: Path,
        *,
        facts: dict = FACTS,
        fsx: Path | None = None,
        cluster: dict[str, list[tuple[str, str]]] = CLUSTER,
    ):
        self.base = base
        self.root = base / "root"
        self.scripts = base / "lifecycle"  # what HyperPod downloads from s3://<bucket>/lifecycle/
        self.bin = base / "bin"
        self.record = base / "calls.log"
        shutil.copytree(LIFECYCLE_DIR, self.scripts, ignore=shutil.ignore_patterns("__pycache__"))
        (self.scripts / "cluster-facts.json").write_text(json.dumps(facts, indent=2))
        self.resource_config_path = self.root / "opt/ml/config/resource_config.json"
        self.resource_config_path.parent.mkdir(parents=True)
        self.resource_config_path.write_text(json.dumps(resource_config(cluster), indent=2))
        if fsx is None:
            (self.root / "fsx").mkdir()
        else:  # another node's /fsx: the shared file system
            (self.root / "fsx").symlink_to(fsx)
        self.slurm_etc = self.root / "opt/slurm/etc"
        self.slurm_etc.mkdir(parents=True)
        (self.slurm_etc / "slurm.conf").write_text(SLURM_CONF)
        self.bin.mkdir()
        self.install_recorders(*RECORDERS)
        if NODE_PYTHON.is_file():
            (self.bin / "python3").symlink_to(NODE_PYTHON)

    @property
    def fsx(self) -> Path:
        return self.root / "fsx"

    def install_recorders(self, *names: str) -> None:
        for name in names:
            path = self.bin / name
            path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$RECORD_LOG"\n{RECORDERS[name]}\n')
            path.chmod(0o755)

    def remove_recorder(self, name: str) -> None:
        (self.bin / name).unlink()

    def add_neuron_devices(self, count: int = 16) -> None:
        (self.root / "dev").mkdir(exist_ok=True)
        for index in range(count):
            (self.root / "dev" / f"neuron{index}").touch()

    def add_efa_devices(self, count: int) -> None:
        """EFA devices as the efa driver registers them with ibverbs: /sys/class/infiniband/rdmap*."""
        folder = self.root / "sys/class/infiniband"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            (folder / f"rdmap{index}s0").mkdir()

    def write_enroot_conf(self, text: str) -> Path:
        path = self.root / "etc/enroot/enroot.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def run(self, ips: str, *, mounted: bool = True, user: str = "ubuntu", shell: str = "bash", **env: str) -> Run:
        self.record.write_text("")
        environment = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "LIFECYCLE_ROOT": str(self.root),
            "RECORD_LOG": str(self.record),
            "REAL_CHOWN": shutil.which("chown"),
            "FAKE_NODE_IPS": ips,
            "FAKE_MOUNTPOINTS": str(self.fsx) if mounted else "",
            "FAKE_USER": f"{user}:{USER_ID}:{USER_ID}",
            "FAKE_STATE": str(self.base / "state"),
            **env,
        }
        for inherited in ("SAGEMAKER_RESOURCE_CONFIG_PATH", "LIFECYCLE_NODE_IPS", "LIFECYCLE_FACTS_FILE"):
            if inherited not in env:
                environment.pop(inherited, None)
        done = subprocess.run(
            [shell, str(self.scripts / "on_init_complete.sh")],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr, self.record.read_text().splitlines())

    def snapshot(self) -> dict[str, tuple]:
        """Every path under the root with its type, mode, owner, mtime and content."""
        state = {}
        for path in sorted([self.root, *self.root.rglob("*"), *self.fsx.resolve().rglob("*")]):
            info = path.lstat()
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            state[str(path)] = (info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, content)
        return state
