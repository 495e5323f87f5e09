"""The config object: defaults, `-c` string coercion, and bad values that must stop synth."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from cluster_contract import FACT_KEYS
from stacks.accelerators import GPU_CUDA_CAPABILITY, INSTANCE_TYPES, REFUSED_INSTANCE_TYPES
from stacks.aws_catalog import hyperpod_instance_types, schema_published
from stacks.build import REPO_ROOT
from stacks.compute_groups import parse_compute_groups
from stacks.config import (
    LIST_PARSERS,
    OFFLINE_ACCOUNT,
    HyperPodConfig,
    StackConfigError,
    capacity_warnings,
    cluster_facts,
    lane_warnings,
    storage_warnings,
)

pytestmark = pytest.mark.xdist_group("infra")

CDK_JSON = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
PARTITION_KEYS = {
    "group",
    "partition",
    "instance_type",
    "count",
    "accelerator",
    "devices_per_node",
    "efa_interfaces",
    "efa_device_rdma",
    "fp8",
    "image_uri",
    "serving_image_uri",
    "image_family",
    "peak_tflops",
    "host_memory_gib",
    "capacity",
    "training_plan_arn",
    "scale_with_runs",
    "min_instance_count",
}
IMAGES = {"neuron": "123456789012.dkr.ecr.us-west-2.amazonaws.com/repo:neuron", "cuda": "repo:cuda"}


def parse(**context: object) -> HyperPodConfig:
    return HyperPodConfig.from_context(context, environ={})


def test_cdk_json_sets_every_knob_to_the_dataclass_default():
    known = HyperPodConfig.keys()
    ours = {key: value for key, value in CDK_JSON.items() if key in known}
    assert sorted(ours) == sorted(known), "every config key is documented in cdk.json"
    defaults = {field.name: field.default for field in dataclasses.fields(HyperPodConfig)}
    ours["compute_groups"] = parse_compute_groups(ours["compute_groups"])
    ours |= {key: parse(ours[key]) for key, parse in LIST_PARSERS.items()}
    assert ours == defaults


def test_cdk_json_turns_template_schema_findings_into_synth_errors():
    assert CDK_JSON["@aws-cdk/core:validateAgainstDefaultRules"] is True


def test_defaults_reproduce_the_blog_setup():
    config = HyperPodConfig.from_context(CDK_JSON, environ={})
    assert (config.controller_instance_type, config.controller_instance_count) == ("ml.c5.xlarge", 1)
    (compute,) = config.compute_groups
    assert (compute.name, compute.instance_type, compute.count, compute.partition) == (
        "compute",
        "ml.trn1.32xlarge",
        1,
        "trn1",
    )
    assert (compute.threads_per_core, compute.capacity, compute.training_plan_arn) == (1, "on-demand", "")
    assert (config.fsx_storage_capacity_gib, config.fsx_compression) == (1200, "LZ4")
    assert config.retain_outputs is False
    assert config.availability_zone_id.startswith("usw2-az")
    assert config.account == OFFLINE_ACCOUNT  # no credentials: no lookup needs an account (zone IDs)
    assert not [key for key in CDK_JSON if key.startswith("availability-zones:")], "no cached lookups needed"
    assert config.bucket_name.startswith("sagemaker-") and len(config.bucket_name) <= 63


def test_account_auto_follows_the_credentials():
    config = HyperPodConfig.from_context({"account": "auto"}, environ={"CDK_DEFAULT_ACCOUNT": "210987654321"})
    assert config.account == "210987654321"
    assert config.bucket_name == "sagemaker-hyperpod-lora-210987654321-us-west-2"


@pytest.mark.parametrize(
    ("raw", "expected"), [("true", True), ("False", False), ("1", True), ("no", False), (True, True)]
)
def test_booleans_from_the_command_line(raw, expected):
    assert parse(retain_outputs=raw).retain_outputs is expected


def test_integers_and_strings_from_the_command_line():
    config = parse(login_instance_count="4", fsx_storage_capacity_gib=" 4800 ", account=123456789012)
    assert (config.login_instance_count, config.fsx_storage_capacity_gib) == (4, 4800)
    assert config.account == "123456789012"


# (key, bad value, words the message must contain to tell the user what is allowed)
BAD_VALUES = [
    ("fsx_storage_capacity_gib", "1000", "multiple of 2400"),
    ("fsx_storage_capacity_gib", "3600", "multiple of 2400"),
    ("fsx_throughput_mibps_per_tib", "200", "125, 250, 500, 1000"),
    ("fsx_compression", "GZIP", "LZ4, NONE"),
    ("controller_instance_count", "2", "exactly one"),
    ("controller_instance_type", "c5.xlarge", "e.g. ml.c5.xlarge"),
    ("login_instance_count", "-1", "0: no login group"),
    ("vpc_cidr", "10.0.0.0/24", "/16 to /20"),
    ("vpc_cidr", "8.8.0.0/16", "private IPv4"),
    ("vpc_cidr", "10.0.0.1/16", "CIDR form"),
    ("availability_zone_id", "use1-az4", "a zone ID of the configured region us-west-2, e.g. usw2-az1"),
    ("availability_zone_id", "us-west-2d", "an Availability Zone ID such as usw2-az4 (not a zone name)"),
    ("region", "uswest2", "a region where SageMaker has an endpoint"),
    ("region", "ma-rs-1", "a region where SageMaker has an endpoint"),
    ("controller_instance_type", "ml.c5.3xlarge", "an instance type HyperPod offers (botocore's"),
    ("login_instance_type", "ml.trn1.2xlarge", "an instance type HyperPod offers (botocore's"),
    ("account", "12345", "12-digit"),
    ("name_prefix", "HyperPod_Lora", "lowercase"),
    ("name_prefix", "this-prefix-is-far-too-long", "3 to 20"),
    ("slurm_config_strategy", "managed", "Managed, Overwrite, Merge"),
    ("node_recovery", "Off", "Automatic, None"),
    ("runtime", "docker", "pyxis, host"),
    ("retain_outputs", "maybe", "true or false"),
    ("stack_name", "1stack", "CloudFormation stack name"),
    ("observability", "grafana", "prometheus, managed, off"),
]


@pytest.mark.parametrize(("key", "value", "allowed"), BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_bad_value_names_key_value_and_what_is_allowed(key, value, allowed):
    with pytest.raises(StackConfigError) as caught:
        parse(**{key: value})
    message = str(caught.value)
    assert f"'{key}'" in message
    assert f"has value {value!r}" in message or f"has value {value}" in message
    assert allowed in message
    assert f"-c {key}=" in message


def test_unknown_key_is_a_typo_with_a_suggestion():
    with pytest.raises(
        StackConfigError,
        match=r"unknown config key 'compute_group' \(did you mean 'compute_groups'\?\)",
    ):
        parse(compute_group="[]")


@pytest.mark.parametrize("key", ["compute_instance_type", "compute_instance_count", "partition_name"])
def test_retired_single_group_keys_point_to_compute_groups(key):
    with pytest.raises(StackConfigError, match=f"'{key}' was replaced by 'compute_groups'"):
        parse(**{key: "1"})


def test_cdk_feature_flags_and_lookups_are_not_config_keys():
    config = parse(**{"@aws-cdk/core:checkSecretUsage": True, "availability-zones:account=1:region=x": ["a"]})
    assert config == HyperPodConfig(account=OFFLINE_ACCOUNT)


def test_direct_construction_is_validated_too():
    with pytest.raises(StackConfigError, match="'login_instance_count' has value '2'; allowed: a value of type int"):
        HyperPodConfig(login_instance_count="2")


def test_cluster_facts_follow_the_contract():
    config = parse(login_instance_count="1", runtime="host")
    facts = cluster_facts(config, image_uris=IMAGES)
    assert tuple(facts) == FACT_KEYS  # what lifecycle/node_facts.py requires
    assert facts["devices_per_node"] == 32 and isinstance(facts["devices_per_node"], int)
    assert (facts["accelerator"], facts["efa_interfaces"]) == ("neuron", 8)
    assert facts["login_group"] == "login" and facts["runtime"] == "host"
    assert facts["image_uri"] == IMAGES["neuron"]
    paths = {key: value for key, value in facts.items() if key.endswith("_dir")}
    assert all(value.startswith(facts["fsx_mount_path"] + "/") for value in paths.values())
    assert facts["payloads_dir"] == "/fsx/payloads" and facts["outputs_dir"] == "/fsx/outputs"
    scalars = {key: value for key, value in facts.items() if key != "partitions"}
    integers = ("devices_per_node", "efa_interfaces", "efa_device_rdma", "alert_stall_minutes")
    assert all(isinstance(v, int) if k in integers else isinstance(v, str) for k, v in scalars.items())
    assert list(facts["partitions"]) == ["trn1"] and set(facts["partitions"]["trn1"]) == PARTITION_KEYS


def test_cluster_facts_describe_every_partition_of_a_mixed_cluster():
    groups = [
        {"name": "trn", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 2},
        {"name": "gpu", "instance_type": "ml.g5.48xlarge", "partition": "g5", "count": 0, "capacity": "spot"},
        {"name": "cpu", "instance_type": "ml.c5.4xlarge", "partition": "cpu"},
    ]
    config = parse(compute_groups=json.dumps(groups))
    assert config.image_families == ("neuron", "cuda")
    facts = cluster_facts(config, image_uris=IMAGES)
    assert (facts["compute_groups"], facts["default_partition"], facts["compute_group"]) == (
        "trn,gpu,cpu",
        "trn1",
        "trn",
    )
    g5 = facts["partitions"]["g5"]
    assert (g5["accelerator"], g5["devices_per_node"], g5["efa_interfaces"], g5["image_uri"]) == (
        "cuda",
        8,
        1,
        IMAGES["cuda"],
    )
    assert (g5["count"], g5["capacity"], g5["efa_device_rdma"]) == (0, "spot", 0)  # g5's EFA has no GPUDirect RDMA
    assert facts["partitions"]["trn1"]["efa_device_rdma"] == 1
    assert (g5["fp8"], facts["partitions"]["trn1"]["fp8"]) == (0, 0)  # A10G: compute capability 8.6
    # A CPU-only group runs in the first image the config builds.
    assert facts["partitions"]["cpu"]["image_uri"] == IMAGES["neuron"]
    assert (facts["partitions"]["cpu"]["accelerator"], facts["partitions"]["cpu"]["devices_per_node"]) == ("none", 0)


def test_accelerator_table_rows():
    assert (INSTANCE_TYPES["ml.trn1.32xlarge"].devices, INSTANCE_TYPES["ml.trn1.32xlarge"].efa_interfaces) == (32, 8)
    assert (INSTANCE_TYPES["ml.p5.48xlarge"].accelerator, INSTANCE_TYPES["ml.p5.48xlarge"].devices) == ("cuda", 8)
    assert INSTANCE_TYPES["ml.p5.48xlarge"].efa_interfaces == 32
    assert INSTANCE_TYPES["ml.g5.12xlarge"].devices == 4
    assert INSTANCE_TYPES["ml.c5.xlarge"].accelerator == "none"
    assert "ml.trn1.2xlarge" not in INSTANCE_TYPES  # HyperPod does not offer it
    assert parse(login_instance_count="0").login_group == ""


def test_newer_gpu_rows_and_their_cuda_capability():
    rows = {name: INSTANCE_TYPES[name] for name in ("ml.g6.48xlarge", "ml.g6e.48xlarge", "ml.p6-b200.48xlarge")}
    assert {name: (f.devices, f.efa_interfaces, f.device_model) for name, f in rows.items()} == {
        "ml.g6.48xlarge": (8, 1, "L4"),
        "ml.g6e.48xlarge": (8, 4, "L40S"),
        "ml.p6-b200.48xlarge": (8, 8, "B200"),
    }
    efa = [INSTANCE_TYPES[t].efa_interfaces for t in ("ml.p5en.48xlarge", "ml.g6.xlarge", "ml.g6e.24xlarge")]
    assert efa == [16, 0, 2]
    assert [INSTANCE_TYPES[t].efa_device_rdma for t in ("ml.p6-b200.48xlarge", "ml.g6e.48xlarge")] == [True, False]
    assert INSTANCE_TYPES["ml.p4d.24xlarge"].cuda_capability == (8, 0)
    assert INSTANCE_TYPES["ml.p6-b200.48xlarge"].cuda_capability == (10, 0)  # compares as a tuple, not "10.0" < "8.9"
    for instance_type, facts in INSTANCE_TYPES.items():
        assert (facts.cuda_capability is not None) == (facts.accelerator == "cuda"), instance_type


def test_rows_for_the_types_hyperpod_added_later():
    """p5.4xlarge, p6-b300 and g7e: GPUs, EFA, device RDMA and capability as the cited sources give them."""
    names = ["ml.p5.4xlarge", "ml.p6-b300.48xlarge", *(f"ml.g7e.{n}xlarge" for n in (2, 4, 8, 12, 24, 48))]
    rows = [
        (INSTANCE_TYPES[n].devices, INSTANCE_TYPES[n].efa_interfaces, INSTANCE_TYPES[n].efa_device_rdma) for n in names
    ]
    assert rows == [(1, 1, True), (8, 16, True)] + [
        (d, e, False) for d, e in ((1, 0), (1, 0), (1, 1), (2, 1), (4, 2), (8, 4))
    ]
    capability = {
        n: INSTANCE_TYPES[n].cuda_capability for n in ("ml.p5.4xlarge", "ml.p6-b300.48xlarge", "ml.g7e.2xlarge")
    }
    assert capability == {"ml.p5.4xlarge": (9, 0), "ml.p6-b300.48xlarge": (10, 3), "ml.g7e.2xlarge": (12, 0)}
    assert all(INSTANCE_TYPES[n].supports_fp8 for n in names)
    # trn2.3xlarge's single EFA and the Gr6 (L4) rows, from the same HyperPod CLI table.
    assert INSTANCE_TYPES["ml.trn2.3xlarge"].efa_interfaces == 1
    gr6 = {
        n: (INSTANCE_TYPES[n].device_model, INSTANCE_TYPES[n].devices, INSTANCE_TYPES[n].efa_interfaces)
        for n in ("ml.gr6.4xlarge", "ml.gr6.8xlarge")
    }
    assert gr6 == {"ml.gr6.4xlarge": ("L4", 1, 0), "ml.gr6.8xlarge": ("L4", 1, 1)}
    # Refused (arm64 hosts), so neither a row nor silently unknown.
    assert "ml.p6e-gb200.36xlarge" in REFUSED_INSTANCE_TYPES and "ml.p6e-gb200.36xlarge" not in INSTANCE_TYPES


def test_g7_rows_carry_the_rtx_pro_4500_per_size():
    """ml.g7.*: in botocore's ClusterInstanceType, RTX PRO 4500 Blackwell (12.0) GPUs 1/1/1/2/4/8, no EFA claimed."""
    names = [f"ml.g7.{n}xlarge" for n in (2, 4, 8, 12, 24, 48)]
    assert set(names) <= hyperpod_instance_types()
    rows = [
        (INSTANCE_TYPES[n].devices, INSTANCE_TYPES[n].efa_interfaces, INSTANCE_TYPES[n].device_model) for n in names
    ]
    assert rows == [(d, 0, "RTX PRO 4500 32GB") for d in (1, 1, 1, 2, 4, 8)]
    assert all(INSTANCE_TYPES[n].cuda_capability == (12, 0) and INSTANCE_TYPES[n].supports_fp8 for n in names)
    assert parse(compute_groups=[{"name": "g7", "instance_type": "ml.g7.12xlarge", "partition": "g7"}]).image_families
    # every HyperPod GPU family the config knows by family name is in the table now (g7 was the gap)
    families = {t.split(".")[1] for t in INSTANCE_TYPES}
    assert {"g7", "g7e"} <= families


def test_fp8_support_follows_the_capability():
    """FP8 needs 8.9: Ada (L4, L40S), Hopper and Blackwell yes; Ampere (A100, A10G), Trainium, CPU no."""
    fp8 = {t for t, f in INSTANCE_TYPES.items() if f.supports_fp8}
    assert {"ml.g6.xlarge", "ml.g6e.12xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.p6-b200.48xlarge"} <= fp8
    assert fp8.isdisjoint({"ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.g5.48xlarge", "ml.trn1.32xlarge", "ml.c5.xlarge"})
    assert GPU_CUDA_CAPABILITY["V100"] < (7, 5) <= GPU_CUDA_CAPABILITY["T4"]  # what a CUDA 13 gate compares
    assert INSTANCE_TYPES["ml.g5.xlarge"].meets_cuda_capability((7, 5))
    assert not INSTANCE_TYPES["ml.trn1.32xlarge"].meets_cuda_capability((7, 5))


def test_app_prints_a_clean_error_and_exits_2(tmp_path):
    """What `cdk synth -c fsx_throughput_mibps_per_tib=333` shows: one line, no traceback."""
    env = {
        **os.environ,
        "CDK_OUTDIR": str(tmp_path),
        "CDK_CONTEXT_JSON": json.dumps({**CDK_JSON, "fsx_throughput_mibps_per_tib": "333"}),
    }
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: config key 'fsx_throughput_mibps_per_tib' has value 333; allowed: one of 125, 250, "
        "500, 1000. Fix it in cdk.json (context) or pass -c fsx_throughput_mibps_per_tib=<value>."
    ]


def test_a_vpc_overlapping_dockers_bridge_is_refused():
    for cidr in ("172.17.0.0/16", "172.17.128.0/17"):
        refused = rf"'vpc_cidr' has value '{re.escape(cidr)}'; allowed: .*Docker's default bridge"
        with pytest.raises(StackConfigError, match=refused):
            HyperPodConfig.from_context({"vpc_cidr": cidr}, environ={})
    assert HyperPodConfig.from_context({"vpc_cidr": "172.18.0.0/16"}, environ={})
    assert HyperPodConfig.from_context({"vpc_cidr": "172.17.0.0/16", "lanes": "jobs"}, environ={})  # no VPC then


def test_a_jobs_only_config_warns_of_each_cluster_key_it_ignores():
    config = HyperPodConfig.from_context({"lanes": "jobs", "vpc_cidr": "10.1.0.0/16", "fsx_compression": "NONE"})
    assert lane_warnings(config) == [
        "config key 'vpc_cidr' is '10.1.0.0/16', but lanes = jobs creates no cluster, so it is ignored; remove it "
        "or set lanes = both",
        "config key 'fsx_compression' is 'NONE', but lanes = jobs creates no cluster, so it is ignored; remove it "
        "or set lanes = both",
    ]
    assert lane_warnings(HyperPodConfig.from_context({"vpc_cidr": "10.1.0.0/16"})) == []


def test_a_jobs_only_config_of_trainium2_groups_is_refused_naming_the_cluster_lane():
    trn2 = {"name": "trn2", "instance_type": "ml.trn2.48xlarge", "count": 1, "partition": "trn2"}
    trn1 = {"name": "trn1", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"}
    where = {"region": "us-east-2", "availability_zone_id": "use2-az2"}
    with pytest.raises(StackConfigError) as caught:
        parse(lanes="jobs", compute_groups=[trn2], **where)
    message = str(caught.value)
    assert "'lanes' has value 'jobs'; allowed: cluster or both for compute_groups of ml.trn2.48xlarge only" in message
    assert "submit trn2 runs on the cluster lane (hpctl submit)" in message
    assert parse(lanes="both", compute_groups=[trn2], **where).image_families == ("torchneuron",)
    assert parse(lanes="jobs", compute_groups=[trn2, trn1], **where).image_families == ("neuron", "torchneuron")


def test_a_region_without_published_schemas_is_not_a_cluster_region():
    """cfn-lint ships a copy of us-east-1's table for the isolated regions: it vouches for nothing there."""
    with pytest.raises(
        StackConfigError, match="'region' has value 'us-iso-east-1'; allowed: a region whose CloudFormation"
    ):
        HyperPodConfig.from_context({"region": "us-iso-east-1", "availability_zone_id": "usie1-az1"}, environ={})
    assert schema_published("us-west-2") and schema_published("us-east-1")
    assert not schema_published("us-iso-east-1")


def test_managed_observability_needs_continuous_provisioning_and_names_both_keys():
    with pytest.raises(StackConfigError) as caught:
        parse(observability="managed", provisioning="standard")
    message = str(caught.value)
    assert "'observability' = managed" in message and "'provisioning' = continuous" in message
    assert parse(observability="managed").observability == "managed"  # continuous is the default
    assert parse(observability="managed", lanes="jobs").observability == "managed"  # no cluster to extend


@pytest.mark.parametrize("mode", ["prometheus", "managed", "off"])
def test_cluster_facts_carry_the_observability_mode(mode):
    spot = [{"name": "gpu", "instance_type": "ml.g5.48xlarge", "partition": "g5", "count": 1, "capacity": "spot"}]
    config = parse(observability=mode, compute_groups=spot)
    facts = cluster_facts(config, image_uris={"cuda": "repo:cuda"})
    assert facts["observability"] == mode
    own = mode == "prometheus"
    assert facts["metrics_textfile_path"] == ("/var/lib/hyperpod-lora/metrics" if own else "")
    assert facts["node_exporter_image"] == facts["metrics_remote_write_url"] == ""  # none given here


def test_an_fsx_size_past_the_largest_hyperpod_accepts_is_warned_by_key():
    """FSx documents no largest PERSISTENT_2 size, so 240,000,000 GiB is a warning, not a refusal."""
    (warning,) = storage_warnings(HyperPodConfig.from_context({"fsx_storage_capacity_gib": 240_000_000}))
    assert warning.startswith("config key 'fsx_storage_capacity_gib' is 240,000,000 GiB, above 100,800 GiB")
    assert storage_warnings(HyperPodConfig.from_context({"fsx_storage_capacity_gib": 100_800})) == []
    # The jobs lane creates no file system: the lane warning covers the key there.
    assert storage_warnings(HyperPodConfig.from_context({"fsx_storage_capacity_gib": 240_000, "lanes": "jobs"})) == []


@pytest.mark.parametrize(
    "cidr", ["169.254.0.0/16", "127.0.0.0/16", "0.0.0.0/16", "100.64.0.0/16", "192.0.0.0/16", "198.18.0.0/16"]
)
def test_a_vpc_outside_rfc_1918_is_refused(cidr):
    """Python calls link-local, loopback and 'this network' private; a VPC may only use RFC 1918's blocks."""
    with pytest.raises(StackConfigError, match=rf"'vpc_cidr' has value '{re.escape(cidr)}'; allowed: .*RFC 1918"):
        parse(vpc_cidr=cidr)


def test_a_vpc_inside_each_rfc_1918_block_is_taken():
    for cidr in ("10.0.0.0/16", "172.31.0.0/16", "192.168.0.0/16", "10.200.16.0/20"):
        assert parse(vpc_cidr=cidr).vpc_cidr == cidr
    with pytest.raises(StackConfigError, match="'vpc_cidr'"):
        parse(vpc_cidr="172.32.0.0/16")  # just past 172.16.0.0/12


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("account", "\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660\u0661\u0662"),  # Arabic-Indic
        ("account", "12345678901\u0969"),  # one Devanagari digit
        ("availability_zone_id", "usw\u0662-az4"),
        ("availability_zone_id", "usw2-az\u0664"),
    ],
)
def test_ids_in_non_ascii_digits_are_refused_by_key(key, value):
    with pytest.raises(StackConfigError, match=rf"config key '{key}' has value"):
        parse(**{key: value})


def test_non_ascii_digits_are_not_integers_or_plan_accounts():
    with pytest.raises(StackConfigError, match="'login_instance_count'"):
        parse(login_instance_count="\u0661")
    plan = "arn:aws:sagemaker:us-west-2:12345678901\u0662:training-plan/p"
    group = {"name": "gpu", "instance_type": "ml.g5.12xlarge", "partition": "g5", "training_plan_arn": plan}
    with pytest.raises(StackConfigError, match="training_plan_arn"):
        parse(compute_groups=[group])


def test_a_jobs_only_config_warns_of_observability_and_of_cluster_only_group_keys():
    group = {
        "name": "gpu",
        "instance_type": "ml.g5.12xlarge",
        "partition": "g5",
        "count": 2,
        "min_instance_count": 1,
        "capacity": "spot",
    }
    config = parse(lanes="jobs", observability="managed", compute_groups=[group])
    warnings = lane_warnings(config)
    assert warnings[0].startswith("config key 'observability' is 'managed', but lanes = jobs creates no cluster")
    named = [re.search(r"key '(\w+)' is", w).group(1) for w in warnings[1:]]
    assert named == ["count", "min_instance_count", "capacity"]
    assert all("group [0] (gpu)" in w for w in warnings[1:])
    assert lane_warnings(parse(lanes="both", observability="managed", compute_groups=[group])) == []


def test_a_minimum_on_a_spot_group_is_warned():
    spot = {"name": "gpu", "instance_type": "ml.g5.12xlarge", "partition": "g5", "count": 2, "capacity": "spot"}
    (warning,) = capacity_warnings(parse(compute_groups=[{**spot, "min_instance_count": 1}]))
    assert "group [0] (gpu), key 'min_instance_count' is 1 on a Spot group" in warning
    assert capacity_warnings(parse(compute_groups=[spot])) == []
    assert capacity_warnings(parse(compute_groups=[{**spot, "capacity": "on-demand", "min_instance_count": 1}])) == []


SCALED_GROUP = {
    "name": "gpu",
    "instance_type": "ml.g5.12xlarge",
    "partition": "g5",
    "count": 4,
    "scale_with_runs": True,
}


def test_scale_with_runs_deploys_the_floor_and_tells_the_partition():
    config = parse(compute_groups=[{**SCALED_GROUP, "min_instance_count": 1}])
    (group,) = config.compute_groups
    assert (group.scale_with_runs, group.deployed_count, group.count) == (True, 1, 4)
    facts = cluster_facts(config, image_uris=IMAGES)["partitions"]["g5"]
    assert (facts["scale_with_runs"], facts["min_instance_count"], facts["count"]) == (1, 1, 4)
    assert parse(compute_groups=[{**SCALED_GROUP, "scale_with_runs": "false"}]).compute_groups[0].deployed_count == 4


def test_scale_with_runs_needs_continuous_provisioning_and_a_count():
    with pytest.raises(
        StackConfigError, match=r"key 'scale_with_runs' has value True; allowed: false with provisioning"
    ):
        parse(provisioning="standard", slurm_config_strategy="Managed", compute_groups=[SCALED_GROUP])
    with pytest.raises(StackConfigError, match=r"key 'count' has value 0; allowed: 1 or more with scale_with_runs"):
        parse(compute_groups=[{**SCALED_GROUP, "count": 0}])
    (warning,) = lane_warnings(parse(lanes="jobs", compute_groups=[{**SCALED_GROUP, "count": 1}]))
    assert "key 'scale_with_runs' is True, but lanes = jobs creates no cluster" in warning
