"""The facts that change with each deploy (the runtime, each partition's image and accelerator
facts), read from the payloads.

The lifecycle script writes the cluster facts into a node's profile only when HyperPod provisions
the node, so a later deploy that pushes a new image never reaches running nodes that way. The stack
therefore also writes these facts to ``payloads/deploy-facts.json`` in the bucket, which FSx imports
next to this package on every deploy; submit reads them there, and they win over the profile.
Stdlib only (the controller's Python 3.10).
"""

from __future__ import annotations

import json
from pathlib import Path

from llm_pipeline.errors import StepError

DEPLOY_FACTS_FILE = "deploy-facts.json"
KEYS = ("runtime", "default_partition", "partition_images", "partitions")
# Per partition (llm_pipeline.jobs.partitions reads them): what the launch and env.sh need.
PARTITION_KEYS = ("accelerator", "devices_per_node", "efa_interfaces", "efa_device_rdma", "fp8")
# Written by newer deploys, read when present (llm_pipeline.jobs.partitions.OPTIONAL_FACT_ENV).
OPTIONAL_PARTITION_KEYS = ("image_family", "peak_tflops", "host_memory_gib", "serving_image_uri")
# What submit pins for every job of a chain (slurm/env.sh reads them).
ENV_NAMES = ("HPL_IMAGE_URI", "HPL_RUNTIME")


REDEPLOY = "deploy again (`make deploy`) to rewrite it"


def _load(payloads_dir: Path) -> tuple[Path, dict | None]:
    path = Path(payloads_dir) / DEPLOY_FACTS_FILE
    if not path.is_file():
        return path, None
    redeploy = REDEPLOY
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StepError(f"{path} cannot be read ({exc}): {redeploy}") from None
    if not isinstance(facts, dict) or sorted(facts) != sorted(KEYS):
        got = sorted(facts) if isinstance(facts, dict) else type(facts).__name__
        raise StepError(f"{path} must hold a JSON object with keys {', '.join(KEYS)}, got {got}: {redeploy}")
    return path, facts


def read_partitions(payloads_dir: Path) -> tuple[dict[str, dict[str, object]], str]:
    """({partition: its facts}, the default partition); ({}, "") when the file is absent (local runs)."""
    path, facts = _load(payloads_dir)
    if facts is None:
        return {}, ""
    partitions = facts["partitions"]
    good = isinstance(partitions, dict) and bool(partitions)
    if good:
        good = all(isinstance(v, dict) and all(key in v for key in PARTITION_KEYS) for v in partitions.values())
    if not good:
        raise StepError(f"{path}: partitions must map each partition to {', '.join(PARTITION_KEYS)}: {REDEPLOY}")
    default = facts["default_partition"]
    if default not in partitions:
        raise StepError(f"{path}: the default partition {default!r} is not among {', '.join(partitions)}: {REDEPLOY}")
    return partitions, default


def read_deploy_facts(payloads_dir: Path, *, partition: str | None = None) -> dict[str, str]:
    """HPL_RUNTIME and HPL_IMAGE_URI (the image of ``partition``, default: the cluster's default
    partition) from ``<payloads_dir>/deploy-facts.json``; none when the file is absent (local runs)."""
    path, facts = _load(payloads_dir)
    if facts is None:
        return {}
    redeploy = REDEPLOY
    images = facts["partition_images"]
    if not isinstance(images, dict) or not images:
        raise StepError(f"{path}: partition_images must map partitions to image URIs: {redeploy}")
    chosen = partition or facts["default_partition"]
    if chosen not in images:
        raise StepError(
            f"{path}: partition {chosen!r} (HPL_PARTITION) has no image; the deployed partitions are "
            f"{', '.join(sorted(images))}: submit to one of them, or deploy the partition"
        )
    values = {"HPL_IMAGE_URI": images[chosen], "HPL_RUNTIME": facts["runtime"]}
    for name, value in values.items():
        if not isinstance(value, str) or not value:
            raise StepError(f"{path}: the value for {name} must be a non-empty string, got {value!r}: {redeploy}")
    return values
