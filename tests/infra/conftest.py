"""Fixtures for the CDK app tests: the app is synthesized once per session (one xdist group).

Every test module here carries ``pytestmark = pytest.mark.xdist_group("infra")`` so that under
``pytest -n 2 --dist loadgroup`` a single worker builds the app and runs them all.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# jsii prints a Node-20 end-of-life banner on every start; it is known and harmless here (see the
# toolchain notes) and only buries test output. Must be set before aws_cdk is first imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import boto3
from aws_cdk import CfnResource
from botocore.stub import Stubber

from stacks.build import REPO_ROOT, build_app
from stacks.config import OFFLINE_ACCOUNT, HyperPodConfig
from stacks.image import SERVING_FAMILY_BUILD_ARG
from stacks.observability import UPSTREAM_BUILD_ARG
from stacks.uploads import CACHE_EXCLUDES

SOURCE_FOLDERS = ("lifecycle", "payloads", "observability")


def pytest_addoption(parser: pytest.Parser) -> None:
    # Honoured when tests/infra is named on the command line (as `make snapshot-update` does).
    parser.addoption(
        "--snapshot-update",
        action="store_true",
        default=False,
        help="rewrite tests/infra/__snapshots__ from the current synth instead of comparing",
    )


@dataclass(frozen=True)
class Synth:
    """One synthesized app: its config, template, cloud assembly folder and construct tree."""

    config: HyperPodConfig
    template: dict[str, Any]
    outdir: Path
    app: Any
    stack: Any

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {key: res for key, res in self.template["Resources"].items() if res["Type"] == kind}

    def one(self, kind: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(kind)
        assert len(found) == 1, f"expected one {kind}, found {sorted(found)}"
        return next(iter(found.items()))

    def logical_id(self, construct: Any) -> str:
        return self.stack.resolve(self.stack.get_logical_id(construct))

    def cfn_ids_under(self, construct: Any, kind: str | None = None) -> set[str]:
        """Logical ids of the CloudFormation resources inside ``construct`` (optionally of one type)."""
        return {
            self.logical_id(c)
            for c in construct.node.find_all()
            if isinstance(c, CfnResource) and kind in (None, c.cfn_resource_type)
        }

    def assets_manifest(self) -> dict[str, Any]:
        return json.loads((self.outdir / f"{self.config.stack_name}.assets.json").read_text())

    def training_images(self) -> dict[str, Any]:
        """The docker image assets less the exporter images (test_infra_observability.py covers those) and the
        serving images (serving_images)."""
        images = self.assets_manifest()["dockerImages"]
        return {
            key: i
            for key, i in images.items()
            if not {UPSTREAM_BUILD_ARG, SERVING_FAMILY_BUILD_ARG} & set(i["source"].get("dockerBuildArgs", {}))
        }

    def serving_images(self) -> dict[str, str]:
        """{image tag: family} of the serving images (payloads/Dockerfile.serve) cdk-assets builds."""
        found = {}
        for image in self.assets_manifest()["dockerImages"].values():
            family = image["source"].get("dockerBuildArgs", {}).get(SERVING_FAMILY_BUILD_ARG)
            if family:
                assert image["source"]["dockerFile"] == "Dockerfile.serve"
                (destination,) = image["destinations"].values()
                found[destination["imageTag"]] = family
        return found


def repo_context(**overrides: Any) -> dict[str, Any]:
    """cdk.json context as the CLI would pass it, pinned to the offline account."""
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return {**context, "account": OFFLINE_ACCOUNT, **overrides}


def copy_sources(destination: Path, origin: Path = REPO_ROOT) -> Path:
    """A private copy of lifecycle/ and payloads/ so concurrent edits in the checkout cannot race a test."""
    for folder in SOURCE_FOLDERS:
        shutil.copytree(origin / folder, destination / folder, ignore=shutil.ignore_patterns(*CACHE_EXCLUDES))
    return destination


def synthesize(outdir: Path, source_root: Path, **overrides: Any) -> Synth:
    app, stack = build_app(repo_context(**overrides), source_root=source_root, outdir=str(outdir))
    app.synth()
    template = json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
    return Synth(stack.config, template, outdir, app, stack)


@pytest.fixture(scope="session")
def source_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory, source_root: Path) -> Synth:
    """The default app (cdk.json as committed), synthesized once for the whole session."""
    return synthesize(tmp_path_factory.mktemp("cdk.out"), source_root)


@pytest.fixture(scope="session")
def synth_variant(tmp_path_factory: pytest.TempPathFactory, source_root: Path) -> Synth:
    """Every non-default branch at once, values given as strings the way `-c key=value` passes them."""
    return synthesize(
        tmp_path_factory.mktemp("cdk.out.variant"),
        source_root,
        retain_outputs="true",
        login_instance_count="1",
        compute_groups='[{"name": "compute", "instance_type": "ml.trn1n.32xlarge", "count": "2", "partition": "trn1"}]',
        region="us-east-1",
        availability_zone_id="use1-az6",
        fsx_storage_capacity_gib="2400",
        slurm_config_strategy="Overwrite",
        provisioning="standard",
        lanes="both",
    )


# The two other configs the issue names, each with its own template snapshot, lint and cdk-nag run.
GPU_ONLY_GROUPS = [
    {"name": "gpu", "instance_type": "ml.p5.48xlarge", "count": 4, "partition": "p5", "capacity": "spot"}
]
MIXED_GROUPS = [
    {"name": "trn", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"},
    {
        "name": "gpu",
        "instance_type": "ml.g5.12xlarge",
        "count": 2,
        "partition": "g5",
        "training_plan_arn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/g5-reserved",
        "deep_health_checks": ["InstanceStress", "InstanceConnectivity"],
    },
]
NAMED_CONFIGS = {
    "gpu-only": {"stack_name": "HyperPodGpuOnly", "compute_groups": json.dumps(GPU_ONLY_GROUPS)},
    "mixed": {"stack_name": "HyperPodMixed", "compute_groups": MIXED_GROUPS},
}


@pytest.fixture(scope="session")
def named_synths(tmp_path_factory: pytest.TempPathFactory, source_root: Path) -> dict[str, Synth]:
    """The GPU-only (4 x p5, spot, as `-c` JSON text) and mixed (trn1 + g5 on a training plan) apps."""
    return {
        name: synthesize(tmp_path_factory.mktemp(f"cdk.out.{name}"), source_root, **overrides)
        for name, overrides in NAMED_CONFIGS.items()
    }


@pytest.fixture(scope="session")
def synthesize_from(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Synth]:
    def run(source_root: Path, **overrides: Any) -> Synth:
        return synthesize(tmp_path_factory.mktemp("cdk.out.extra"), source_root, **overrides)

    return run


# Other app shapes, each synthesized once per session: their own modules test them, and
# test_infra_checkov.py scans them all.
# A Trainium and a GPU group: each lane needs an image of both families.
TRN_AND_GPU_GROUPS = [
    {"name": "trn", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"},
    {"name": "gpu", "instance_type": "ml.g5.12xlarge", "count": 1, "partition": "g5"},
]
SPOT_GPU = json.dumps(
    [{"name": "gpu", "instance_type": "ml.g5.xlarge", "count": 1, "partition": "g5", "capacity": "spot"}]
)
TRN2_GROUPS = [
    {"name": "trn2", "instance_type": "ml.trn2.48xlarge", "count": 2, "partition": "trn2"},
    {"name": "trn1", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"},
]


@pytest.fixture(scope="session")
def jobs_synth(synthesize_from, source_root: Path) -> Synth:
    return synthesize_from(source_root, stack_name="HyperPodJobsOnly", lanes="jobs")


@pytest.fixture(scope="session")
def jobs_gpu_synth(synthesize_from, source_root: Path) -> Synth:
    return synthesize_from(source_root, stack_name="HyperPodJobsGpu", lanes="jobs", compute_groups=TRN_AND_GPU_GROUPS)


@pytest.fixture(scope="session")
def both_gpu_synth(synthesize_from, source_root: Path) -> Synth:
    return synthesize_from(source_root, stack_name="HyperPodBothGpu", lanes="both", compute_groups=TRN_AND_GPU_GROUPS)


@pytest.fixture(scope="session")
def mode_synths(synthesize_from, source_root: Path) -> dict[str, Synth]:
    """Observability managed and off, each on a Spot group (continuous provisioning, which managed needs)."""
    return {
        mode: synthesize_from(source_root, observability=mode, compute_groups=SPOT_GPU, stack_name=f"Obs{mode}")
        for mode in ("managed", "off")
    }


@pytest.fixture(scope="session")
def trn2_synth(synthesize_from, source_root: Path) -> Synth:
    """A trn2 and a trn1 group in us-east-2 (where cfn-lint's pricing data has trn2.48xlarge)."""
    return synthesize_from(
        source_root,
        stack_name="HyperPodTrn2",
        region="us-east-2",
        availability_zone_id="use2-az2",
        compute_groups=TRN2_GROUPS,
    )


# A flexible group: HyperPod takes the first of its types it has capacity for (InstanceRequirements).
FLEXIBLE_GPU = [{"name": "gpu", "instance_types": ["ml.g5.12xlarge", "ml.g5.24xlarge", "ml.g6e.12xlarge"],
                 "count": 2, "partition": "g5"}]  # fmt: skip


@pytest.fixture(scope="session")
def flexible_synth(synthesize_from, source_root: Path) -> Synth:
    return synthesize_from(source_root, stack_name="HyperPodFlexible", compute_groups=FLEXIBLE_GPU)


EXTERNAL_ACCOUNTING_DB = {"accounting_database": "external", "accounting_database_zone_id": "usw2-az1"}
# The external database's shape also scales its group with runs: the controller's own role and the scaler's
# grant are checked there (test_infra_aws_calls.py), and linted and scanned with the rest.
SCALED_GROUPS = [
    {"name": "compute", "instance_type": "ml.trn1.32xlarge", "count": 2, "partition": "trn1", "scale_with_runs": True}
]


@pytest.fixture(scope="session")
def external_db_synth(synthesize_from, source_root: Path) -> Synth:
    """Slurm accounting in an RDS instance the stack creates (docs/teams.md), its second zone usw2-az1; its
    group scales with runs."""
    return synthesize_from(
        source_root, stack_name="HyperPodExternalDb", compute_groups=SCALED_GROUPS, **EXTERNAL_ACCOUNTING_DB
    )


@pytest.fixture
def sources_copy(tmp_path: Path, source_root: Path) -> Path:
    """A fresh copy of the session's sources, for a test to modify (same bytes as the baseline synth)."""
    return copy_sources(tmp_path / "sources", origin=source_root)


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No credentials anywhere: no AWS_/CDK_ variable, profile, config file or metadata service."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "CDK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


class StubbedSession(boto3.Session):
    """AWS answered by botocore Stubbers, one client per service, where moto cannot play it (the app's
    real template, Service Quotas, training plans). A call to a service not stubbed fails the test."""

    def __init__(self, region: str = "us-west-2") -> None:
        super().__init__(region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing")
        self.clients: dict[str, Any] = {}
        self.stubbers: dict[str, Stubber] = {}

    def stub(self, service: str) -> Stubber:
        if service not in self.stubbers:
            self.clients[service] = super().client(service)
            self.stubbers[service] = Stubber(self.clients[service])
            self.stubbers[service].activate()
        return self.stubbers[service]

    def client(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        assert service_name in self.clients, f"unexpected call to {service_name}"
        return self.clients[service_name]

    def verify(self) -> None:
        """Every stubbed answer was asked for."""
        for stubber in self.stubbers.values():
            stubber.assert_no_pending_responses()


@pytest.fixture
def stubbed_session(no_aws_credentials: pytest.MonkeyPatch) -> Callable[..., StubbedSession]:
    return StubbedSession
