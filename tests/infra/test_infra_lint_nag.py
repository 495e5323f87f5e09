"""cfn-lint (two regions) and cdk-nag AwsSolutions on the synthesized app."""

from __future__ import annotations

import json

import pytest
from aws_cdk import Validations

from stacks import summary
from stacks.lint import IGNORED_CHECKS, lint_template
from stacks.nag import PLUGIN_PREFIX

pytestmark = pytest.mark.xdist_group("infra")


def template_path(synth):
    return synth.outdir / f"{synth.config.stack_name}.template.json"


@pytest.mark.parametrize("region", ["us-west-2", "us-east-1"])
def test_cfn_lint_finds_nothing(synth, region):
    matches = lint_template(template_path(synth), [region])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []


@pytest.mark.parametrize("name", ["gpu-only", "mixed"])
def test_cfn_lint_finds_nothing_in_the_gpu_configs(named_synths, name):
    matches = lint_template(template_path(named_synths[name]), ["us-west-2"])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []


def test_summary_shows_capacity_and_training_plan(named_synths, capsys):
    assert summary.main([str(named_synths["mixed"].outdir)]) == 0
    out = capsys.readouterr().out
    assert "trn          Compute    ml.trn1.32xlarge x1  partition trn1  on-demand" in out
    assert "gpu          Compute    ml.g5.12xlarge x2  partition g5  on-demand, training plan g5-reserved" in out
    assert summary.main([str(named_synths["gpu-only"].outdir)]) == 0
    assert "gpu          Compute    ml.p5.48xlarge x4  partition p5  spot" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["gpu-only", "mixed"])
def test_cdk_nag_passes_the_gpu_configs(named_synths, name):
    report = nag_report(named_synths[name])
    assert report["conclusion"] == "success"
    assert report["violations"] == []


def test_cfn_lint_catches_a_broken_cluster(synth, tmp_path):
    """The lint is live: an unknown instance type and recovery mode must be reported as errors."""
    template = json.loads(json.dumps(synth.template))
    cluster = next(r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Cluster")
    cluster["Properties"]["InstanceGroups"][1]["InstanceType"] = "ml.trn9.32xlarge"
    cluster["Properties"]["NodeRecovery"] = "Sometimes"
    broken = tmp_path / "broken.template.json"
    broken.write_text(json.dumps(template))
    assert {m.rule.id for m in lint_template(broken, ["us-west-2"])} & {"E3030", "E3644"}


def test_only_warnings_are_ignored_each_with_a_reason():
    assert all(check.startswith("W") for check in IGNORED_CHECKS)
    assert all(len(reason) > 20 for reason in IGNORED_CHECKS.values())


def test_summary_lints_and_describes_the_assembly(synth, capsys):
    assert summary.main([str(synth.outdir)]) == 0
    out = capsys.readouterr().out
    assert "0 errors" in out and "us-west-2" in out
    assert "compute      Compute    ml.trn1.32xlarge x1  partition trn1" in out
    assert "fsx: Lustre 2.15 PERSISTENT_2 1200 GiB" in out
    assert "link /outputs <-> bucket prefix /outputs/ (import+export)" in out
    assert "outputs: ClusterName, ClusterArn" in out


@pytest.mark.parametrize(
    ("orchestrator", "mode", "shown"),
    [
        ({"Slurm": {}}, "Continuous", "(Slurm, Merge, continuous provisioning's only strategy, recovery Automatic)"),
        ({"Slurm": {"SlurmConfigStrategy": "Managed"}}, None, "(Slurm, Managed, recovery Automatic)"),
    ],
)
def test_summary_names_the_slurm_strategy_even_when_the_template_leaves_it_out(orchestrator, mode, shown):
    cluster = {"ClusterName": "c", "Orchestrator": orchestrator, "NodeRecovery": "Automatic", "InstanceGroups": []}
    if mode:
        cluster["NodeProvisioningMode"] = mode
    lines = summary.describe({"Resources": {"Cluster": {"Type": "AWS::SageMaker::Cluster", "Properties": cluster}}})
    assert f"  cluster c {shown}:" in lines and "?" not in "\n".join(lines)


def test_summary_without_an_assembly_says_what_to_do(tmp_path, capsys):
    assert summary.main([str(tmp_path)]) == 2
    assert "run `make synth`" in capsys.readouterr().err


def nag_report(synth) -> dict:
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    return next(p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions")


def recorded_acknowledgments(synth) -> dict[tuple[str, str], str]:
    """(construct path, rule id) -> reason, for every AwsSolutions acknowledgment in the app."""
    found = {}
    for construct in synth.stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule_id, reason in entry.data.items():
                    if rule_id.startswith(PLUGIN_PREFIX):
                        found[(construct.node.path, rule_id)] = reason
    return found


def test_cdk_nag_has_no_unacknowledged_findings(synth):
    report = nag_report(synth)
    assert report["conclusion"] == "success"
    assert report["violations"] == []


def test_every_acknowledgment_is_used_and_explained(synth):
    """No stale acknowledgments: each one suppresses a finding that really fires, for a specific reason."""
    used = {(v["acknowledgedAt"], v["acknowledgedId"]) for v in nag_report(synth)["suppressedViolations"]}
    recorded = recorded_acknowledgments(synth)
    assert set(recorded) == used
    reasons = list(recorded.values())
    assert all(len(reason) >= 60 for reason in reasons), "a reason says why, for this app"
    assert len(set(reasons)) == len(reasons), "no copy-pasted reasons"
    assert not any(rule_id == PLUGIN_PREFIX + "AwsSolutions-IAM5" for _, rule_id in recorded), (
        "IAM5 acknowledgments name the exact wildcard"
    )
