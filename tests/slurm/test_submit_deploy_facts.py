"""The latest deploy's image and runtime reach the jobs: submit reads deploy-facts.json next to the
payloads it runs from (as FSx imports them) and pins its values for every job of the chain."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import REPO, RUN_STEPS, job_lines

from llm_pipeline.errors import StepError
from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE, read_deploy_facts

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-submit_deploy_facts")]
OLD_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/cdk-assets:aaaa"  # the node profile's, from provisioning
NEW_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/cdk-assets:bbbb"  # pushed by the latest deploy
GPU_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/cdk-assets:cccc"  # another partition's family
TRN1_FACTS = {"accelerator": "neuron", "devices_per_node": 32, "efa_interfaces": 8, "efa_device_rdma": 1, "fp8": 0}
PARTS = ', "partitions": ' + json.dumps({"trn1": TRN1_FACTS})


@pytest.fixture
def fsx(tmp_path: Path) -> Path:
    """/fsx with the payloads as FSx imports them from s3://<bucket>/payloads/ (the code, no facts yet)."""
    root = tmp_path / "fsx"
    payloads = root / "payloads"
    for folder in ("llm_pipeline", "slurm"):
        shutil.copytree(REPO / "payloads" / folder, payloads / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "payloads" / "configs").mkdir()
    (root / "payloads" / "configs" / "run.toml").write_text(f"[paths]\noutput_dir = '{root}/outputs/run'\n")
    return root


def submit_dry_run(fsx: Path, *, partition: str | None = None) -> subprocess.CompletedProcess[str]:
    """submit from the FSx copy, on a stdlib-only Python, in a login shell holding the old profile."""
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(fsx / 'payloads')!r}); sys.argv = ['submit', *sys.argv[1:]]; "
        "runpy.run_module('llm_pipeline.submit', run_name='__main__')"
    )
    profile = {"HPL_RUNTIME": "host", "HPL_IMAGE_URI": OLD_IMAGE, "HPL_FSX_MOUNT_PATH": str(fsx)}
    if partition:
        profile["HPL_PARTITION"] = partition
    config = fsx / "payloads" / "configs" / "run.toml"
    return subprocess.run(
        [sys.executable, "-S", "-c", code, "--config", str(config), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, **profile},
    )


def write_facts(fsx: Path, **changes) -> None:
    facts = {
        "runtime": "pyxis",
        "default_partition": "trn1",
        "partition_images": {"trn1": NEW_IMAGE, "h100": GPU_IMAGE},
        "partitions": {
            "trn1": TRN1_FACTS,
            "h100": {**TRN1_FACTS, "accelerator": "cuda", "devices_per_node": 8, "efa_interfaces": 32, "fp8": 1},
        },
        **changes,
    }
    (fsx / "payloads" / DEPLOY_FACTS_FILE).write_text(json.dumps(facts))


@pytest.mark.parametrize(("partition", "image"), [(None, NEW_IMAGE), ("trn1", NEW_IMAGE), ("h100", GPU_IMAGE)])
def test_jobs_get_the_latest_deploys_image_and_runtime(fsx, partition, image):
    write_facts(fsx)
    out = submit_dry_run(fsx, partition=partition)
    assert out.returncode == 0, out.stderr
    jobs = job_lines(out.stdout)
    assert [line.split("=", 1)[0] for line in jobs if not line.startswith(("smoke_", "estimate_"))] == [
        f"{step}_job" for step in RUN_STEPS
    ]  # the smoke stage's jobs too: every job of the chain gets the same image
    for line in jobs:
        assert f"HPL_IMAGE_URI={image}" in line and "HPL_RUNTIME=pyxis" in line
        assert OLD_IMAGE not in line


def test_without_the_file_the_profile_values_are_pinned(fsx):
    out = submit_dry_run(fsx)
    assert out.returncode == 0, out.stderr
    assert all(f"HPL_IMAGE_URI={OLD_IMAGE}" in line and "HPL_RUNTIME=host" in line for line in job_lines(out.stdout))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot be read"),
        ('["pyxis"]', "must hold a JSON object with keys runtime, default_partition, partition_images, partitions"),
        ('{"runtime": "pyxis"}', "got ['runtime']"),
        (
            '{"runtime": "pyxis", "default_partition": "x", "partition_images": []' + PARTS + "}",
            "partition_images must map",
        ),
        (
            '{"runtime": "pyxis", "default_partition": "gone", "partition_images": {"trn1": "i"}' + PARTS + "}",
            "partition 'gone'",
        ),
        (
            '{"runtime": "", "default_partition": "trn1", "partition_images": {"trn1": "i"}' + PARTS + "}",
            "HPL_RUNTIME must be",
        ),
    ],
)
def test_a_bad_facts_file_is_named(fsx, content, message):
    path = fsx / "payloads" / DEPLOY_FACTS_FILE
    path.write_text(content)
    with pytest.raises(StepError, match=re.escape(message)):
        read_deploy_facts(fsx / "payloads")
    out = submit_dry_run(fsx)
    assert out.returncode == 2 and out.stderr.startswith(f"error: {path}")
