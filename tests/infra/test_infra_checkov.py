"""checkov on every app shape: no finding unless skipped on its resource with a reason, and no skip unused.

One checkov run scans the default, GPU-only, mixed, jobs-only, both-lanes, trn2 and each observability
mode's template, plus the default template with every skip removed: that copy must fail exactly the
checks the skips name, so a skip can neither hide a new finding nor outlive the one it was for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from stacks.checkov_skips import METADATA_KEY

pytestmark = pytest.mark.xdist_group("infra")

CHECKOV = Path(sys.prefix) / "checkov" / "bin" / "checkov"  # beside the venv running the tests (make venv)
UNSKIPPED = "default-without-skips"


def skips_in(template: dict) -> set[tuple[str, str]]:
    """(check id, logical id) of every checkov skip written in the template."""
    return {
        (entry["id"], logical_id)
        for logical_id, resource in template["Resources"].items()
        for entry in resource.get("Metadata", {}).get(METADATA_KEY, {}).get("skip", [])
    }


def without_skips(template: dict) -> dict:
    bare = json.loads(json.dumps(template))
    for resource in bare["Resources"].values():
        resource.get("Metadata", {}).pop(METADATA_KEY, None)
    return bare


@pytest.fixture(scope="module")
def templates(
    synth, named_synths, jobs_synth, both_gpu_synth, mode_synths, trn2_synth, external_db_synth, flexible_synth
) -> dict[str, dict]:
    shapes = {
        "default": synth,
        **named_synths,
        "jobs-only": jobs_synth,
        "both-lanes": both_gpu_synth,
        "trn2": trn2_synth,
        "external-accounting-db": external_db_synth,
        "flexible-types": flexible_synth,
    }
    shapes.update({f"observability-{mode}": s for mode, s in mode_synths.items()})
    found = {name: s.template for name, s in shapes.items()}
    found[UNSKIPPED] = without_skips(synth.template)
    return found


@pytest.fixture(scope="module")
def scan(templates, tmp_path_factory) -> dict[str, dict[str, set[tuple[str, str]]]]:
    """One checkov run over every template: name -> {"failed"|"skipped": {(check id, logical id)}}."""
    assert CHECKOV.is_file(), f"{CHECKOV} is missing: `make venv` installs it (requirements-checkov.txt)"
    folder = tmp_path_factory.mktemp("checkov")
    for name, template in templates.items():
        (folder / f"{name}.template.json").write_text(json.dumps(template))
    files = [arg for name in templates for arg in ("-f", f"{name}.template.json")]
    command = [str(CHECKOV), *files, "--framework", "cloudformation", "--output", "json", "--skip-download"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: some check failed (the copy without skips)
    report = json.loads(done.stdout)
    found: dict[str, dict[str, set]] = defaultdict(lambda: {"failed": set(), "skipped": set()})
    for kind in ("failed", "skipped"):
        for check in report["results"][f"{kind}_checks"]:
            name = Path(check["file_path"]).name.removesuffix(".template.json")
            found[name][kind].add((check["check_id"], check["resource"].split(".", 1)[1]))
    assert report["summary"]["parsing_errors"] == 0
    return found


SHAPES = [
    "default",
    "gpu-only",
    "mixed",
    "jobs-only",
    "both-lanes",
    "trn2",
    "observability-off",
    "observability-managed",
    "external-accounting-db",
    "flexible-types",
]


@pytest.mark.parametrize("shape", SHAPES)
def test_checkov_finds_nothing_that_is_not_skipped_with_a_reason(scan, templates, shape):
    assert scan[shape]["failed"] == set()
    assert scan[shape]["skipped"] == skips_in(templates[shape]), "every skip in the template is used"


def test_the_skips_hide_exactly_the_findings_they_name(scan, templates):
    """The scanner is live: without its skips the default template fails exactly the skipped checks."""
    skipped = skips_in(templates["default"])
    assert scan[UNSKIPPED]["failed"] == skipped
    assert {check for check, _ in skipped} >= {"CKV_AWS_18", "CKV_AWS_111", "CKV_AWS_115"}


def test_every_skip_says_why_in_its_own_words(templates):
    reasons = {
        entry["id"]: entry["comment"]
        for template in templates.values()
        for resource in template["Resources"].values()
        for entry in resource.get("Metadata", {}).get(METADATA_KEY, {}).get("skip", [])
    }
    assert all(len(reason) >= 80 for reason in reasons.values()), reasons
    assert len(set(reasons.values())) == len(reasons), "one reason per check, not a copied one"


def test_log_groups_are_encrypted_with_the_stacks_key_which_lets_only_this_regions_logs_use_it(synth):
    ((key_id, key),) = [(k, r) for k, r in synth.resources("AWS::KMS::Key").items() if k.startswith("LogsKey")]
    groups = synth.resources("AWS::Logs::LogGroup")
    assert groups and all(g["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]} for g in groups.values())
    assert key["Properties"]["EnableKeyRotation"] is True and key["DeletionPolicy"] == "Delete"
    (logs_statement,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if "Service" in s["Principal"]]
    region, account = synth.config.region, synth.config.account
    assert logs_statement["Principal"] == {"Service": f"logs.{region}.amazonaws.com"}
    assert logs_statement["Condition"] == {
        "ArnLike": {"kms:EncryptionContext:aws:logs:arn": f"arn:aws:logs:{region}:{account}:log-group:*"}
    }
