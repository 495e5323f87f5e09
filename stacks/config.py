"""The app's configuration: one frozen, validated object parsed from cdk.json context.

Every knob is a context key (override with ``cdk synth -c key=value``; such values arrive as
strings and are coerced here). This module is also the single source of truth for the facts the
nodes need (FSx folders, group names, NeuronCores per instance type): the stack turns them into
``cluster-facts.json`` with :func:`cluster_facts`, and the lifecycle script exports them as HPL_*.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stacks.validation import ConfigError, Rule, coerce, int_range, ipv4_cidr, matches, one_of

__all__ = ["DATA_LINKS", "ConfigError", "DataLink", "HyperPodConfig", "cluster_facts"]

# Used when no account is configured and no credentials name one (offline synth, tests);
# cdk.json answers this account's availability-zone lookup so synth needs no AWS call.
OFFLINE_ACCOUNT = "123456789012"

# Instance groups. HyperPod names SSM targets and log streams after them.
CONTROLLER_GROUP = "controller"
LOGIN_GROUP = "login"
COMPUTE_GROUP = "compute"
DEFAULT_USER = "ubuntu"  # the AMI's login user; HyperPod shares its home and SSH keys across nodes

# Logical NeuronCores per compute instance (what a training step spreads over). trn2 counts
# are at the default logical-core size LNC=2 (two physical cores per logical core).
NEURON_CORES_PER_INSTANCE = {
    "ml.trn1.2xlarge": 2,
    "ml.trn1.32xlarge": 32,
    "ml.trn1n.32xlarge": 32,
    "ml.trn2.3xlarge": 4,
    "ml.trn2.48xlarge": 64,
}

# Shared file system layout (FSx for Lustre, mounted on every node).
FSX_MOUNT_PATH = "/fsx"
PAYLOADS_FOLDER = "payloads"
DATASETS_FOLDER = "datasets"
OUTPUTS_FOLDER = "outputs"
MODELS_FOLDER = "models"
COMPILE_CACHE_FOLDER = "neuron-cache"
IMAGES_FOLDER = "images"
SCRATCH_FOLDER = "scratch"

# Lifecycle upload: s3://<bucket>/lifecycle/ holds the script HyperPod runs once Slurm is up
# (OnInitComplete) and the generated facts file it reads.
LIFECYCLE_PREFIX = "lifecycle"
LIFECYCLE_SCRIPT = "on_init_complete.sh"
CLUSTER_FACTS_FILE = "cluster-facts.json"
# HyperPod rejects an API-configured Slurm cluster whose lifecycle prefix holds this legacy file.
LEGACY_PROVISIONING_FILE = "provisioning_parameters.json"

AUTO_EVENTS = ("NEW", "CHANGED", "DELETED")


@dataclass(frozen=True)
class DataLink:
    """An FSx folder linked to the bucket prefix of the same name by a data repository association."""

    folder: str
    auto_import: bool
    auto_export: bool

    @property
    def s3_prefix(self) -> str:
        return f"{self.folder}/"

    @property
    def fsx_path(self) -> str:
        return f"/{self.folder}"


DATA_LINKS = (
    DataLink(PAYLOADS_FOLDER, auto_import=True, auto_export=False),
    DataLink(DATASETS_FOLDER, auto_import=True, auto_export=False),
    # Import and export: adapters and merged models land durably in S3.
    DataLink(OUTPUTS_FOLDER, auto_import=True, auto_export=True),
)


@dataclass(frozen=True)
class HyperPodConfig:
    """Every knob of the app; defaults reproduce the reference blog's single-node setup."""

    stack_name: str = "HyperPodLlamaLora"
    name_prefix: str = "hyperpod-lora"
    account: str = "auto"  # 12 digits, or "auto": CDK_DEFAULT_ACCOUNT (credentials), else offline
    region: str = "us-west-2"
    availability_zone: str = "us-west-2d"  # must offer the compute instance type in your account
    vpc_cidr: str = "10.0.0.0/16"
    controller_instance_type: str = "ml.c5.xlarge"
    controller_instance_count: int = 1
    login_instance_type: str = "ml.m5.4xlarge"
    login_instance_count: int = 0  # 0: no login group
    compute_instance_type: str = "ml.trn1.32xlarge"
    compute_instance_count: int = 1
    compute_threads_per_core: int = 1
    compute_ebs_volume_gb: int = 500
    fsx_storage_capacity_gib: int = 1200
    fsx_throughput_mibps_per_tib: int = 250
    fsx_compression: str = "LZ4"
    partition_name: str = "trn1"
    slurm_config_strategy: str = "Managed"
    node_recovery: str = "Automatic"
    runtime: str = "pyxis"
    retain_outputs: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if type(value) is not type(field.default):
                raise ConfigError.bad_value(field.name, value, f"a value of type {type(field.default).__name__}")
            RULES[field.name].apply(field.name, value)
        _check_combinations(self)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_context(cls, context: Mapping[str, Any], *, environ: Mapping[str, str] | None = None) -> HyperPodConfig:
        """Parse cdk.json / ``-c`` context; unknown snake_case keys are typos and fail too."""
        known = cls.keys()
        for key in context:
            if key.isidentifier() and key.islower() and key not in known:
                raise ConfigError.unknown_key(key, known)
        values = {}
        for field in dataclasses.fields(cls):
            if field.name in context:
                values[field.name] = coerce(field.name, context[field.name], field.default)
        config = cls(**values)
        if config.account == "auto":
            env = os.environ if environ is None else environ
            resolved = env.get("CDK_DEFAULT_ACCOUNT") or OFFLINE_ACCOUNT
            config = dataclasses.replace(config, account=resolved)
        return config

    # Derived names: one place, so the template, the facts file and the outputs agree.
    @property
    def cluster_name(self) -> str:
        return f"{self.name_prefix}-cluster"

    @property
    def bucket_name(self) -> str:
        # HyperPod's managed instance policy only reads lifecycle scripts from sagemaker-* buckets.
        return f"sagemaker-{self.name_prefix}-{self.account}-{self.region}"

    @property
    def login_group(self) -> str:
        return LOGIN_GROUP if self.login_instance_count else ""

    @property
    def devices_per_node(self) -> int:
        return NEURON_CORES_PER_INSTANCE[self.compute_instance_type]

    @property
    def lifecycle_s3_uri(self) -> str:
        return f"s3://{self.bucket_name}/{LIFECYCLE_PREFIX}/"


INSTANCE_TYPE = matches(r"ml\.[a-z0-9-]+\.[a-z0-9]+", "a SageMaker instance type such as ml.c5.xlarge")
RULES: dict[str, Rule] = {
    "stack_name": matches(
        r"[A-Za-z][A-Za-z0-9-]{0,127}",
        "a CloudFormation stack name: a letter, then letters, digits or hyphens (128 at most)",
    ),
    "name_prefix": matches(
        r"[a-z][a-z0-9-]{1,18}[a-z0-9]",
        "3 to 20 lowercase letters, digits or hyphens, starting with a letter and not ending "
        "with a hyphen (it starts the bucket and cluster names)",
    ),
    "account": matches(r"auto|\d{12}", "a 12-digit AWS account id, or auto (the account of your credentials)"),
    "region": matches(r"[a-z]{2}(-gov)?-[a-z]+-\d", "an AWS region name such as us-west-2"),
    "availability_zone": matches(r"[a-z]{2}(-gov)?-[a-z]+-\d[a-z]", "an availability zone name such as us-west-2d"),
    "vpc_cidr": ipv4_cidr(16, 20),
    "controller_instance_type": INSTANCE_TYPE,
    "controller_instance_count": Rule(
        lambda v: v == 1,
        "1 (an API-configured Slurm cluster has exactly one "
        "controller; multi-head clusters need the legacy provisioning file)",
    ),
    "login_instance_type": INSTANCE_TYPE,
    "login_instance_count": int_range(0, 8, " (0: no login group)"),
    "compute_instance_type": one_of(*NEURON_CORES_PER_INSTANCE),
    "compute_instance_count": int_range(1, 256),
    "compute_threads_per_core": one_of(1, 2),
    "compute_ebs_volume_gb": int_range(1, 16384),
    "fsx_storage_capacity_gib": Rule(
        lambda v: v == 1200 or (v > 0 and v % 2400 == 0),
        "1200 or a multiple of 2400 (FSx for Lustre PERSISTENT_2 SSD sizes)",
    ),
    "fsx_throughput_mibps_per_tib": one_of(125, 250, 500, 1000),
    "fsx_compression": one_of("LZ4", "NONE"),
    "partition_name": Rule(
        lambda v: v != "dev" and bool(re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}", v)),
        "letters and digits, inner hyphens allowed, 64 at most, and not 'dev' (HyperPod "
        "already puts every node in a partition of that name)",
    ),
    "slurm_config_strategy": one_of("Managed", "Overwrite", "Merge"),
    "node_recovery": one_of("Automatic", "None"),
    "runtime": one_of("pyxis", "host"),
    "retain_outputs": one_of(True, False),
}


def _check_combinations(config: HyperPodConfig) -> None:
    if not config.availability_zone.startswith(config.region):
        raise ConfigError.bad_value(
            "availability_zone",
            config.availability_zone,
            f"a zone of the configured region {config.region}, e.g. {config.region}a",
        )


def fsx_dir(folder: str) -> str:
    return f"{FSX_MOUNT_PATH}/{folder}"


def cluster_facts(config: HyperPodConfig, *, image_uri: str) -> dict[str, str | int]:
    """The cluster-facts.json contract: what every node exports as HPL_<KEY>."""
    return {
        "cluster_name": config.cluster_name,
        "region": config.region,
        "bucket": config.bucket_name,
        "image_uri": image_uri,
        "fsx_mount_path": FSX_MOUNT_PATH,
        "payloads_dir": fsx_dir(PAYLOADS_FOLDER),
        "datasets_dir": fsx_dir(DATASETS_FOLDER),
        "outputs_dir": fsx_dir(OUTPUTS_FOLDER),
        "models_dir": fsx_dir(MODELS_FOLDER),
        "compile_cache_dir": fsx_dir(COMPILE_CACHE_FOLDER),
        "images_dir": fsx_dir(IMAGES_FOLDER),
        "scratch_dir": fsx_dir(SCRATCH_FOLDER),
        "controller_group": CONTROLLER_GROUP,
        "login_group": config.login_group,
        "compute_group": COMPUTE_GROUP,
        "partition": config.partition_name,
        "default_user": DEFAULT_USER,
        "devices_per_node": config.devices_per_node,
        "compute_instance_type": config.compute_instance_type,
        "runtime": config.runtime,
    }
