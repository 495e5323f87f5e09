"""The architecture picture is drawn from the synthesized template and must match what is committed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.build import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
import diagram

pytestmark = pytest.mark.xdist_group("infra")
COMMITTED = REPO_ROOT / "docs" / "architecture.dot"


def test_diagram_matches_the_synthesized_template(synth) -> None:
    dot = diagram.to_dot(diagram.load_templates(synth.outdir))
    assert COMMITTED.read_text() == dot, "docs/architecture.* is stale: run `make diagram` and commit it"


def test_diagram_shows_cluster_fsx_bucket_and_links(synth) -> None:
    dot = diagram.to_dot(diagram.load_templates(synth.outdir))
    cluster_id, _ = synth.one("AWS::SageMaker::Cluster")
    fsx_id, _ = synth.one("AWS::FSx::FileSystem")
    private_subnet = [
        i for i, r in synth.resources("AWS::EC2::Subnet").items() if not r["Properties"].get("MapPublicIpOnLaunch")
    ]
    assert "SageMaker HyperPod cluster" in dot and "ml.trn1.32xlarge" in dot
    assert "FSx for Lustre" in dot and "S3 bucket" in dot and "ECR training image" in dot
    # The cluster and FSx sit inside the private subnet's box; every data repository association is drawn.
    subnet_box = dot.split(f'subgraph "cluster_{private_subnet[0]}"')[1].split("}")[0]
    assert f'"{cluster_id}"' in subnet_box and f'"{fsx_id}"' in subnet_box
    for dra in synth.resources("AWS::FSx::DataRepositoryAssociation"):
        assert f'"{dra}" -> "{fsx_id}"' in dot


def test_diagram_renders_to_svg(synth, tmp_path: Path) -> None:
    assert shutil.which("dot"), "Graphviz `dot` is missing: apt-get install graphviz (.ci/run does)"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "diagram.py"), str(synth.outdir), str(tmp_path / "arch")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    svg = (tmp_path / "arch.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("SageMaker HyperPod cluster", "FSx for Lustre", "S3 bucket"):
        assert text in svg
