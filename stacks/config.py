"""The app's configuration: one frozen, validated object parsed from cdk.json context.

Every knob is a context key (override with ``cdk synth -c key=value``; such values arrive as
strings and are coerced here; ``compute_groups`` takes a JSON list, see stacks/compute_groups.py).
The names shared with hpctl and tools (FSx folders, group names, bucket prefixes) live in
cluster_contract, the per-partition accelerator facts in stacks/accelerators.py: :func:`cluster_facts`
turns them and the config into ``cluster-facts.json``, which the lifecycle script exports as HPL_*.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_contract import (
    CONTROLLER_GROUP,
    DEFAULT_STACK_NAME,
    DEFAULT_USER,
    FSX_FOLDER_FACTS,
    FSX_MOUNT_PATH,
    LIFECYCLE_PREFIX,
    LOGIN_GROUP,
    MANAGED_MODE,
    METRICS_TEXTFILE_DIR,
    OBSERVABILITY_MODES,
    PROMETHEUS_MODE,
    fsx_dir,
)
from stacks.accelerators import CLUSTER_ONLY_FAMILIES, CUDA, NEURON, NO_ACCELERATOR, TORCHNEURON
from stacks.aws_catalog import (
    CLUSTER_RESOURCE_TYPE,
    PROVIDER_SCHEMAS,
    REGIONAL_TABLE,
    cloudformation_supports,
    cluster_regions,
    hyperpod_instance_types,
    partition_of,
    regional_instance_types,
    sagemaker_regions,
    zone_id_prefix,
)
from stacks.compute_groups import (
    CONTEXT_KEY as COMPUTE_GROUPS_KEY,
)
from stacks.compute_groups import (
    DEFAULT_COMPUTE_GROUPS,
    ON_DEMAND,
    SPOT,
    ComputeGroup,
    GroupError,
    check_group,
    check_groups,
    check_training_plan_region,
    parse_compute_groups,
)
from stacks.teams import TEAMS_KEY, USERS_KEY, Team, User, check_teams, parse_teams, parse_users
from stacks.validation import Rule, StackConfigError, coerce, int_range, ipv4_cidr, matches, one_of

__all__ = ["ComputeGroup", "HyperPodConfig", "StackConfigError", "cluster_facts"]

ALERT_EMAILS_KEY = "alert_emails"
EMAIL_PATTERN = r"[^@\s,]+@[^@\s,]+\.[^@\s,]+"


def parse_alert_emails(raw: Any) -> tuple[str, ...]:
    """A JSON list of addresses (cdk.json), or one string of comma-separated addresses (``-c alert_emails=a,b``)."""
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise StackConfigError.bad_value(ALERT_EMAILS_KEY, raw, "a list of e-mail addresses")
    return tuple(item.strip() for item in raw)


LIST_PARSERS = {TEAMS_KEY: parse_teams, USERS_KEY: parse_users, ALERT_EMAILS_KEY: parse_alert_emails}

# Used when no account is configured and no credentials name one (offline synth, tests);
# cdk.json answers this account's availability-zone lookup so synth needs no AWS call.
OFFLINE_ACCOUNT = "123456789012"

COMPUTE_GROUP = DEFAULT_COMPUTE_GROUPS[0].name  # the default config's one compute group
# Context keys of the single-group config, replaced by compute_groups: each error says where it went.
RETIRED_KEYS = {
    "compute_instance_type": "instance_type",
    "compute_instance_count": "count",
    "compute_threads_per_core": "threads_per_core",
    "compute_ebs_volume_gb": "ebs_volume_gb",
    "partition_name": "partition",
}
# What a deploy creates. cluster: the HyperPod cluster and all it needs (VPC, FSx, node role, lifecycle,
# payload upload). jobs: only what SageMaker training jobs need (bucket, images, a job execution role);
# compute_groups still choose the accelerator families, so the images. both: the two together.
LANES = ("cluster", "jobs", "both")
# HyperPod's node provisioning modes. continuous (NodeProvisioningMode: Continuous): groups fill up
# asynchronously and the cluster is InService once the controller is, with MinInstanceCount, node
# operations on logical ids, cluster events, Spot; it manages slurm.conf in merge mode only and
# refuses any SlurmConfigStrategy ("Continuous provisioning for enhanced cluster operations with
# Slurm", sagemaker-hyperpod-scaling-slurm.html). standard: all or nothing, any strategy. AWS does
# not switch a live cluster between them (stacks/update_safety.py refuses it).
CONTINUOUS, STANDARD = "continuous", "standard"
# Where slurmdbd keeps Slurm's accounting: HyperPod's database on the controller, or an RDS MySQL instance the
# stack creates (stacks/accounting_database.py), which outlives the controller.
ACCOUNTING_ON_CONTROLLER, ACCOUNTING_EXTERNAL = "controller", "external"
ACCOUNTING_DATABASES = (ACCOUNTING_ON_CONTROLLER, ACCOUNTING_EXTERNAL)
PROVISIONING_MODES = (CONTINUOUS, STANDARD)
CONTINUOUS_SLURM_STRATEGY = "Merge"
# Training images per family (the accelerator, or Trainium2's TorchNeuron runtime); a CPU-only group
# runs the first image the config builds.
IMAGE_FAMILIES = (NEURON, TORCHNEURON, CUDA)

# The script HyperPod runs on every node once Slurm is up (OnInitComplete), under LIFECYCLE_PREFIX.
LIFECYCLE_SCRIPT = "on_init_complete.sh"
# HyperPod rejects an API-configured Slurm cluster whose lifecycle prefix holds this legacy file.
LEGACY_PROVISIONING_FILE = "provisioning_parameters.json"


@dataclass(frozen=True)
class HyperPodConfig:
    """Every knob of the app; defaults reproduce the reference blog's single-node setup."""

    stack_name: str = DEFAULT_STACK_NAME
    name_prefix: str = "hyperpod-lora"
    account: str = "auto"  # 12 digits, or "auto": CDK_DEFAULT_ACCOUNT (credentials), else offline
    region: str = "us-west-2"
    availability_zone_id: str = "usw2-az4"  # a zone ID (same physical zone in every account) with the capacity
    vpc_cidr: str = "10.0.0.0/16"
    controller_instance_type: str = "ml.c5.xlarge"
    controller_instance_count: int = 1
    login_instance_type: str = "ml.m5.4xlarge"
    login_instance_count: int = 0  # 0: no login group
    compute_groups: tuple[ComputeGroup, ...] = DEFAULT_COMPUTE_GROUPS  # see stacks/compute_groups.py
    fsx_storage_capacity_gib: int = 1200
    fsx_throughput_mibps_per_tib: int = 250
    fsx_compression: str = "LZ4"
    slurm_config_strategy: str = "Merge"  # continuous provisioning takes no other (see PROVISIONING_MODES)
    node_recovery: str = "Automatic"
    provisioning: str = CONTINUOUS  # continuous | standard: HyperPod's NodeProvisioningMode, fixed at create
    runtime: str = "pyxis"
    retain_outputs: bool = False
    lanes: str = "cluster"  # cluster | jobs | both: what the deploy creates (see LANES)
    # prometheus | managed | off: the stack's AMP workspace and exporters, AWS's cluster extension, or none
    observability: str = PROMETHEUS_MODE
    teams: tuple[Team, ...] = ()  # stacks/teams.py: Slurm accounts with fair-share weights and QOS limits
    users: tuple[User, ...] = ()  # stacks/teams.py: Linux users with fixed uids, each in a team
    # controller | external: Slurm's accounting database, HyperPod's on the controller or an RDS MySQL instance
    # the stack creates (stacks/accounting_database.py; needs continuous provisioning and a second zone)
    accounting_database: str = ACCOUNTING_ON_CONTROLLER
    accounting_database_zone_id: str = ""  # external: a second zone ID for the database's subnet group (RDS needs 2)
    # Push alerts (stacks/alerts.py): who gets the alerts topic's messages by e-mail (each confirms once), and how
    # long a training step may print no progress line before its run is reported stalled (0: never)
    alert_emails: tuple[str, ...] = ()
    alert_stall_minutes: int = 30

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if type(value) is not type(field.default):
                raise StackConfigError.bad_value(field.name, value, f"a value of type {type(field.default).__name__}")
            if field.name == COMPUTE_GROUPS_KEY:
                _check_group_objects(value)
            else:
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
            if key == "availability_zone":
                raise StackConfigError(
                    "config key 'availability_zone' was replaced by 'availability_zone_id': zone names map to "
                    "different physical zones in each account, zone IDs do not. Find the ID of your zone with "
                    "`aws ec2 describe-availability-zones --query 'AvailabilityZones[].[ZoneName,ZoneId]'` and set "
                    "availability_zone_id (e.g. usw2-az4) in cdk.json or with -c availability_zone_id=<id>."
                )
            if key in RETIRED_KEYS:
                raise StackConfigError(
                    f"config key '{key}' was replaced by '{COMPUTE_GROUPS_KEY}': set '{RETIRED_KEYS[key]}' in a "
                    f"group of that list instead (see README, Compute groups)."
                )
            if key.isidentifier() and key.islower() and key not in known:
                raise StackConfigError.unknown_key(key, known)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name == COMPUTE_GROUPS_KEY and field.name in context:
                values[field.name] = parse_compute_groups(context[field.name])
            elif field.name in LIST_PARSERS and field.name in context:
                values[field.name] = LIST_PARSERS[field.name](context[field.name])
            elif field.name in context:
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
    def default_group(self) -> ComputeGroup:
        """The first compute group: its partition is where jobs go unless a run config says otherwise."""
        return self.compute_groups[0]

    @property
    def image_families(self) -> tuple[str, ...]:
        """The training images this config needs: one per accelerator family among its groups."""
        present = {group.image_family for group in self.compute_groups}
        needed = tuple(family for family in IMAGE_FAMILIES if family in present)
        return needed or (CUDA,)  # CPU-only groups still run the steps in an image: the CUDA one runs on CPU

    def image_family_of(self, group: ComputeGroup) -> str:
        return group.image_family if group.accelerator != NO_ACCELERATOR else self.image_families[0]

    @property
    def cluster_lane(self) -> bool:
        return self.lanes in ("cluster", "both")

    @property
    def jobs_lane(self) -> bool:
        return self.lanes in ("jobs", "both")

    @property
    def lifecycle_s3_uri(self) -> str:
        return f"s3://{self.bucket_name}/{LIFECYCLE_PREFIX}/"


INSTANCE_TYPE = Rule(
    lambda v: v in hyperpod_instance_types(),
    "an instance type HyperPod offers (botocore's ClusterInstanceType list), e.g. ml.c5.xlarge",
)
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
    "region": Rule(
        lambda v: v in sagemaker_regions(),
        "a region where SageMaker has an endpoint (botocore's endpoints data), e.g. us-west-2, us-east-1",
    ),
    "availability_zone_id": matches(r"[a-z]+\d+-az\d+", "an Availability Zone ID such as usw2-az4 (not a zone name)"),
    "vpc_cidr": ipv4_cidr(16, 20),
    "controller_instance_type": INSTANCE_TYPE,
    "controller_instance_count": Rule(
        lambda v: v == 1,
        "1 (an API-configured Slurm cluster has exactly one "
        "controller; multi-head clusters need the legacy provisioning file)",
    ),
    "login_instance_type": INSTANCE_TYPE,
    "login_instance_count": int_range(0, 8, " (0: no login group)"),
    "fsx_storage_capacity_gib": Rule(
        lambda v: v == 1200 or (v > 0 and v % 2400 == 0),
        "1200 or a multiple of 2400 (FSx for Lustre PERSISTENT_2 SSD sizes)",
    ),
    "fsx_throughput_mibps_per_tib": one_of(125, 250, 500, 1000),
    "fsx_compression": one_of("LZ4", "NONE"),
    "slurm_config_strategy": one_of("Managed", "Overwrite", "Merge"),
    "node_recovery": one_of("Automatic", "None"),
    "provisioning": one_of(*PROVISIONING_MODES),
    "runtime": one_of("pyxis", "host"),
    "retain_outputs": one_of(True, False),
    "lanes": one_of(*LANES),
    "observability": one_of(*OBSERVABILITY_MODES),
    TEAMS_KEY: Rule(lambda v: all(isinstance(t, Team) for t in v), "a list of team objects (docs/teams.md)"),
    USERS_KEY: Rule(lambda v: all(isinstance(u, User) for u in v), "a list of user objects (docs/teams.md)"),
    "accounting_database": one_of(*ACCOUNTING_DATABASES),
    "accounting_database_zone_id": matches(
        r"([a-z]+\d+-az\d+)?", "an Availability Zone ID such as usw2-az1 (not a zone name), or empty"
    ),
    ALERT_EMAILS_KEY: Rule(
        lambda v: all(re.fullmatch(EMAIL_PATTERN, address) for address in v) and len(set(v)) == len(v),
        "a list of distinct e-mail addresses such as ops@example.com (each gets the alerts topic's messages)",
    ),
    "alert_stall_minutes": int_range(0, 1440, " (minutes without a progress line before a run is stalled; 0: off)"),
}


def _check_group_objects(groups: tuple) -> None:
    """Groups built in code (not parsed from context) get the same checks."""
    if not groups or not all(isinstance(group, ComputeGroup) for group in groups):
        raise StackConfigError.bad_value(COMPUTE_GROUPS_KEY, groups, "a non-empty tuple of ComputeGroup")
    for index, group in enumerate(groups):
        check_group(group, f"[{index}] ({group.name})")
    check_groups(groups)


def _check_combinations(config: HyperPodConfig) -> None:
    if config.cluster_lane and not cloudformation_supports(config.region, CLUSTER_RESOURCE_TYPE):
        partition = partition_of(config.region)
        near = sorted(r for r in cluster_regions() if partition_of(r) == partition and r[:2] == config.region[:2])
        raise StackConfigError.bad_value(
            "region",
            config.region,
            f"a region whose CloudFormation has {CLUSTER_RESOURCE_TYPE} ({PROVIDER_SCHEMAS}; {config.region} has "
            f"none){', e.g. ' + ', '.join(near[:4]) if near else ''}; or set lanes = jobs there (SageMaker training "
            "jobs need no cluster)",
        )
    check_training_plan_region(config.compute_groups, config.region)
    _check_jobs_lane_images(config)
    _check_provisioning(config)
    if config.cluster_lane and ipaddress.IPv4Network(config.vpc_cidr).overlaps(DOCKER_BRIDGE):
        raise StackConfigError.bad_value(
            "vpc_cidr",
            config.vpc_cidr,
            f"a network that does not overlap {DOCKER_BRIDGE}, Docker's default bridge on the nodes (containers "
            "could not reach FSx, the controller or S3 addresses in it), e.g. 10.0.0.0/16",
        )
    _check_observability(config)
    check_teams(config.teams, config.users)
    _check_accounting_database(config)
    _check_offered_in_region(config)
    prefix = zone_id_prefix(config.region)
    if prefix and not config.availability_zone_id.startswith(f"{prefix}-"):
        raise StackConfigError.bad_value(
            "availability_zone_id",
            config.availability_zone_id,
            f"a zone ID of the configured region {config.region}, e.g. {prefix}-az1",
        )


# Docker's default bridge network on the nodes' container runtime: a VPC overlapping it makes FSx, the
# controller or S3 unreachable from inside containers (their replies are routed onto the bridge).
DOCKER_BRIDGE = ipaddress.IPv4Network("172.17.0.0/16")
# Keys only the cluster lane reads: with lanes = jobs a value other than the default is ignored (a warning).
CLUSTER_ONLY_KEYS = (
    "availability_zone_id",
    "vpc_cidr",
    "controller_instance_type",
    "login_instance_type",
    "login_instance_count",
    "fsx_storage_capacity_gib",
    "fsx_throughput_mibps_per_tib",
    "fsx_compression",
    "slurm_config_strategy",
    "node_recovery",
    "provisioning",
    "runtime",
    "observability",  # exporters and workspaces watch the cluster's nodes; jobs report to CloudWatch
    "teams",
    "users",
    "accounting_database",
    "accounting_database_zone_id",
    ALERT_EMAILS_KEY,  # the alerts topic watches the cluster and its runs
    "alert_stall_minutes",
)
# Compute-group keys only the cluster reads: on the jobs lane a group only chooses an image (its instance type).
CLUSTER_ONLY_GROUP_KEYS = (
    "count",
    "min_instance_count",
    "capacity",
    "training_plan_arn",
    "ebs_volume_gb",
    "threads_per_core",
    "deep_health_checks",
    "scale_with_runs",
)


# FSx's CreateFileSystem documents no largest PERSISTENT_2 SSD size (only its steps: 1200, then multiples
# of 2400), so nothing above it is refused. This is the largest SizeInGiB HyperPod's own FSxLustreConfig
# accepts (SageMaker API reference, FSxLustreConfig): past it a size is most likely a typo, and it is
# above what FSx's default storage quota in most accounts allows.
FSX_LARGE_GIB = 100_800


def storage_warnings(config: HyperPodConfig) -> list[str]:
    """An FSx size with no documented upper bound, but far past what a cluster of this project needs."""
    if not config.cluster_lane or config.fsx_storage_capacity_gib <= FSX_LARGE_GIB:
        return []
    return [
        f"config key 'fsx_storage_capacity_gib' is {config.fsx_storage_capacity_gib:,} GiB, above {FSX_LARGE_GIB:,} "
        "GiB (the largest file system HyperPod's own FSx setting accepts): check it is not a typo, and that the "
        "account's FSx for Lustre storage quota (Service Quotas, service code fsx) allows it"
    ]


def lane_warnings(config: HyperPodConfig) -> list[str]:
    """Cluster keys (of the config, or of a compute group) set away from their defaults on a config that
    creates no cluster."""
    if config.cluster_lane:
        return []
    defaults = HyperPodConfig.__dataclass_fields__
    ignored = "so it is ignored; remove it or set lanes = both"
    warnings = [
        f"config key '{key}' is {getattr(config, key)!r}, but lanes = {config.lanes} creates no cluster, {ignored}"
        for key in CLUSTER_ONLY_KEYS
        if getattr(config, key) != defaults[key].default
    ]
    group_defaults = ComputeGroup.__dataclass_fields__
    for index, group in enumerate(config.compute_groups):
        for key in CLUSTER_ONLY_GROUP_KEYS:
            value = getattr(group, key)
            if value != group_defaults[key].default:
                warnings.append(
                    f"config key '{COMPUTE_GROUPS_KEY}' group [{index}] ({group.name}), key '{key}' is {value!r}, but "
                    f"lanes = {config.lanes} creates no cluster (the group only chooses the image), {ignored}"
                )
    return warnings


def capacity_warnings(config: HyperPodConfig) -> list[str]:
    """A Spot group with a minimum: Spot capacity may not come (or be reclaimed), and HyperPod rolls a group back
    when fewer than MinInstanceCount nodes arrive within 3 hours, so the minimum makes a Spot shortage a failure."""
    if not config.cluster_lane:
        return []
    return [
        f"config key '{COMPUTE_GROUPS_KEY}' group [{index}] ({group.name}), key 'min_instance_count' is "
        f"{group.min_instance_count} on a Spot group: Spot capacity is not guaranteed, and HyperPod rolls the group "
        "back when fewer than that many nodes arrive within 3 hours; set it to 0 (the group fills as Spot allows) "
        "or use capacity = on-demand"
        for index, group in enumerate(config.compute_groups)
        if group.capacity == SPOT and group.min_instance_count
    ]


def _check_jobs_lane_images(config: HyperPodConfig) -> None:
    """A jobs-only deploy needs an image the jobs lane runs: not one whose groups are all cluster-only (trn2)."""
    if config.cluster_lane or not all(family in CLUSTER_ONLY_FAMILIES for family in config.image_families):
        return
    types = ", ".join(sorted({group.instance_type for group in config.compute_groups}))
    raise StackConfigError.bad_value(
        "lanes",
        config.lanes,
        f"cluster or both for compute_groups of {types} only: SageMaker training jobs do not run the Trainium2 "
        "(TorchNeuron) image yet, so lanes = jobs would build nothing to run; submit trn2 runs on the cluster lane "
        "(hpctl submit), or add a trn1 or GPU group for the jobs lane to build its image",
    )


def _check_provisioning(config: HyperPodConfig) -> None:
    """What only continuous provisioning has (Spot, MinInstanceCount), and what it refuses (a strategy)."""
    if config.provisioning == CONTINUOUS:
        if config.slurm_config_strategy != CONTINUOUS_SLURM_STRATEGY:
            raise StackConfigError.bad_value(
                "slurm_config_strategy",
                config.slurm_config_strategy,
                f"{CONTINUOUS_SLURM_STRATEGY} with provisioning = {CONTINUOUS} (HyperPod manages slurm.conf in merge "
                f"mode there and refuses any other strategy); for Managed or Overwrite set provisioning = {STANDARD}",
            )
        return
    for index, group in enumerate(config.compute_groups):
        where = f"[{index}] ({group.name})"
        if group.capacity == SPOT:
            raise GroupError.at(
                where,
                "capacity",
                group.capacity,
                f"{ON_DEMAND} with provisioning = {STANDARD} (HyperPod runs Spot "
                f"groups with continuous provisioning only: set provisioning = {CONTINUOUS} for a new cluster)",
            )
        if group.scale_with_runs:
            raise GroupError.at(
                where,
                "scale_with_runs",
                group.scale_with_runs,
                f"false with provisioning = {STANDARD} (HyperPod's BatchAddClusterNodes, which the chains scale "
                f"with, works only on clusters with continuous provisioning: set provisioning = {CONTINUOUS})",
            )
        if group.min_instance_count:
            raise GroupError.at(
                where,
                "min_instance_count",
                group.min_instance_count,
                f"0 with provisioning = {STANDARD} "
                f"(MinInstanceCount is a continuous-provisioning setting; standard mode waits for every node)",
            )


def _check_observability(config: HyperPodConfig) -> None:
    """AWS's extension installs only on a cluster in continuous provisioning mode (CreateClusterExtension)."""
    if config.observability == MANAGED_MODE and config.cluster_lane and config.provisioning != CONTINUOUS:
        raise StackConfigError(
            "config key 'observability' = managed needs continuous provisioning (config key 'provisioning' = "
            "continuous; AWS installs its sagemaker-observability extension only on such clusters): set "
            "provisioning = continuous, or observability = prometheus (this stack's own Prometheus setup)"
        )


def _check_accounting_database(config: HyperPodConfig) -> None:
    """HyperPod takes an external accounting database only in continuous provisioning mode (AccountingDatabase),
    and RDS needs subnets in two zones: the cluster's, and accounting_database_zone_id."""
    if config.accounting_database != ACCOUNTING_EXTERNAL or not config.cluster_lane:
        return
    if config.provisioning != CONTINUOUS:
        raise StackConfigError(
            f"config key 'accounting_database' = {ACCOUNTING_EXTERNAL} needs continuous provisioning (config key "
            f"'provisioning' = {CONTINUOUS}; HyperPod accepts an external accounting database only there): set "
            f"provisioning = {CONTINUOUS}, or accounting_database = {ACCOUNTING_ON_CONTROLLER}"
        )
    zone = config.accounting_database_zone_id
    prefix = zone_id_prefix(config.region)
    if not zone or zone == config.availability_zone_id or (prefix and not zone.startswith(f"{prefix}-")):
        raise StackConfigError.bad_value(
            "accounting_database_zone_id",
            zone,
            f"a second zone ID of region {config.region}, other than availability_zone_id "
            f"{config.availability_zone_id} (an RDS database needs subnets in two zones), e.g. {prefix or 'usw2'}-az1",
        )


def _check_offered_in_region(config: HyperPodConfig) -> None:
    """Each instance type must be offered in the region (region x type table: stacks/aws_catalog.py)."""
    offered = regional_instance_types(config.region)
    if offered is None:
        return  # a region the table does not cover: HyperPod itself will say
    allowed = f"a type offered in {config.region} ({REGIONAL_TABLE}), or another region"
    named = [("controller_instance_type", config.controller_instance_type)]
    if config.login_instance_count:
        named.append(("login_instance_type", config.login_instance_type))
    for key, value in named:
        if value not in offered:
            raise StackConfigError.bad_value(key, value, allowed)
    for index, group in enumerate(config.compute_groups):
        for key, value in (
            ("instance_type", group.instance_type),
            *(("instance_types", t) for t in group.instance_types),
        ):
            if value not in offered:
                family = value.split(".")[1][:3]
                same_family = sorted(t for t in offered & hyperpod_instance_types() if t.split(".")[1][:3] == family)
                hint = f"; there: {', '.join(same_family)}" if same_family else ""
                raise GroupError.at(f"[{index}] ({group.name})", key, value, allowed + hint)


def partition_facts(
    config: HyperPodConfig,
    group: ComputeGroup,
    image_uris: Mapping[str, str],
    serving_image_uris: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What a node (and a job) on ``group``'s partition needs: accelerator, devices, EFA, image."""
    family = config.image_family_of(group)
    return {
        "group": group.name,
        "partition": group.partition,
        "instance_type": group.instance_type,
        "count": group.count,
        "accelerator": group.accelerator,
        "devices_per_node": group.devices_per_node,
        "efa_interfaces": group.efa_interfaces,
        "efa_device_rdma": int(group.efa_device_rdma),  # 0/1: node facts are strings and integers
        "fp8": int(group.supports_fp8),  # the ladder's FP8 rungs may run there (llm_pipeline.jobs.partitions)
        "image_uri": image_uris[family],
        "image_family": family,  # torchneuron: Trainium2's native runtime
        # vLLM for the steps that serve under Pyxis (benchmark, GRPO's rollouts, hpctl serve); empty on a host runtime
        "serving_image_uri": (serving_image_uris or {}).get(family, ""),
        "peak_tflops": group.peak_tflops_per_device,  # MFU peak per rank where the payload lacks one (0: none)
        "host_memory_gib": group.host_memory_gib,  # prepare's check of a full fine-tuning load (0: not recorded)
        "capacity": group.capacity,
        "training_plan_arn": group.training_plan_arn,
        # capacity follows the pipeline (llm_pipeline.jobs.capacity): 0/1, the floor and the ceiling
        "scale_with_runs": int(group.scale_with_runs),
        "min_instance_count": group.min_instance_count,
    }


# The exporter images a node may run (stacks/observability.py), as the facts name them: HPL_<NAME>_IMAGE.
EXPORTER_FACTS = {
    "node_exporter": "node_exporter_image",
    "prometheus": "collector_image",
    "dcgm_exporter": "dcgm_exporter_image",
}


def observability_facts(
    config: HyperPodConfig, *, remote_write_url: str = "", exporter_images: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What a node needs to run the exporters and the collector; empty values where the mode has none."""
    own = config.observability == PROMETHEUS_MODE
    images = dict(exporter_images or {}) if own else {}
    return {
        "observability": config.observability,
        "metrics_remote_write_url": remote_write_url if own else "",
        "metrics_textfile_path": METRICS_TEXTFILE_DIR if own else "",
        **{fact: images.get(name, "") for name, fact in EXPORTER_FACTS.items()},
    }


def cluster_facts(
    config: HyperPodConfig,
    *,
    image_uris: Mapping[str, str],
    serving_image_uris: Mapping[str, str] | None = None,
    metrics: Mapping[str, str] | None = None,
    hf_token_secret_arn: str = "",
    alerts_topic_arn: str = "",
) -> dict[str, Any]:
    """The cluster-facts.json contract: what every node exports as HPL_<KEY>.

    ``image_uris`` maps each of :attr:`HyperPodConfig.image_families` to its image, ``serving_image_uris`` to its
    serving image (vLLM; a Pyxis cluster's, none on a host runtime). The flat
    per-partition keys (partition, accelerator, devices_per_node, ...) describe the default
    group; the lifecycle script replaces them with the node's own group on compute nodes.
    ``partitions`` holds every partition's facts for submit. ``metrics`` is :func:`observability_facts`
    (without it: the mode's facts with no workspace or images, as in an offline check of the shape).
    ``hf_token_secret_arn`` names the Hugging Face token's secret (the token is read from it at run time).
    ``alerts_topic_arn`` names the stack's alerts topic (stacks/alerts.py; empty: the run side only logs its alerts).
    """
    partitions = {
        group.partition: partition_facts(config, group, image_uris, serving_image_uris)
        for group in config.compute_groups
    }
    default = partitions[config.default_group.partition]
    return {
        "cluster_name": config.cluster_name,
        "region": config.region,
        "bucket": config.bucket_name,
        "image_uri": default["image_uri"],
        "fsx_mount_path": FSX_MOUNT_PATH,
        **{key: fsx_dir(folder) for key, folder in FSX_FOLDER_FACTS.items()},
        "controller_group": CONTROLLER_GROUP,
        "login_group": config.login_group,
        "compute_groups": ",".join(group.name for group in config.compute_groups),
        "compute_group": default["group"],
        "partition": default["partition"],
        "default_partition": default["partition"],
        "default_user": DEFAULT_USER,
        "accelerator": default["accelerator"],
        "devices_per_node": default["devices_per_node"],
        "efa_interfaces": default["efa_interfaces"],
        "efa_device_rdma": default["efa_device_rdma"],
        "compute_instance_type": default["instance_type"],
        "runtime": config.runtime,
        **(metrics if metrics is not None else observability_facts(config)),
        "hf_token_secret_arn": hf_token_secret_arn,
        # the run side's alerts (llm_pipeline.jobs.alerts): where they go, and when a quiet step is stalled
        "alerts_topic_arn": alerts_topic_arn,
        "alert_stall_minutes": config.alert_stall_minutes,
        "partitions": partitions,
    }
