"""Template snapshot: any change to what the stack deploys shows up as a reviewed diff.

After an intended change: `make snapshot-update` (= pytest tests/infra -k snapshot --snapshot-update),
then review and commit tests/infra/__snapshots__/.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("infra")

SNAPSHOTS = Path(__file__).parent / "__snapshots__"
# Asset hashes (zip keys, image tags, staging folders) change with every CDK release and every
# payload edit; the snapshot is about the resources, not the bytes behind the assets.
ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def normalised(template: dict) -> str:
    return ASSET_HASH.sub("<asset-hash>", json.dumps(template, indent=1, sort_keys=True)) + "\n"


def test_normalising_replaces_only_asset_hashes():
    template = {"Key": "a" * 64 + ".zip", "Id": "DataBucketE6B0FAA8"}
    assert json.loads(normalised(template)) == {"Key": "<asset-hash>.zip", "Id": "DataBucketE6B0FAA8"}


def check_snapshot(synth, request) -> None:
    snapshot = SNAPSHOTS / f"{synth.config.stack_name}.template.json"
    current = normalised(synth.template)
    if request.config.getoption("--snapshot-update", default=False):
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(current)
        return
    assert snapshot.is_file(), f"no snapshot at {snapshot}: run `make snapshot-update` and commit it"
    expected = snapshot.read_text()
    if current != expected:
        diff = difflib.unified_diff(expected.splitlines(), current.splitlines(), "snapshot", "synth", lineterm="", n=2)
        shown = "\n".join(list(diff)[:80])
        pytest.fail(f"the template differs from {snapshot.name}; if intended run `make snapshot-update`:\n{shown}")


def test_template_snapshot(synth, request):
    check_snapshot(synth, request)


@pytest.mark.parametrize("name", ["gpu-only", "mixed"])
def test_gpu_config_template_snapshots(named_synths, name, request):
    """GPU-only (4 x p5 spot) and mixed (trn1 + g5 on a training plan): one snapshot each."""
    check_snapshot(named_synths[name], request)
