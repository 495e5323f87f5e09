"""`python -m stacks.summary cdk.out`: lint every synthesized template and print what it builds.

Runs cfn-lint for us-west-2 and each stack's own region; exits 1 on any lint error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from stacks.cluster import CONTINUOUS_PROVISIONING
from stacks.config import CONTINUOUS_SLURM_STRATEGY
from stacks.lint import is_error, lint_template

BASE_LINT_REGION = "us-west-2"


def stack_artifacts(cdk_out: Path) -> list[tuple[Path, str]]:
    """(template path, region) for every stack in the cloud assembly, nested stages included."""
    found = []
    for manifest in sorted(cdk_out.rglob("manifest.json")):
        artifacts = json.loads(manifest.read_text()).get("artifacts", {})
        for artifact in artifacts.values():
            if artifact.get("type") == "aws:cloudformation:stack":
                region = artifact.get("environment", "aws://unknown-account/unknown-region").rsplit("/", 1)[-1]
                found.append((manifest.parent / artifact["properties"]["templateFile"], region))
    return found


def slurm_strategy(cluster: dict) -> str:
    """The cluster's SlurmConfigStrategy as HyperPod applies it; the template leaves it out under continuous
    provisioning, which merges (stacks/config.py PROVISIONING_MODES)."""
    strategy = cluster.get("Orchestrator", {}).get("Slurm", {}).get("SlurmConfigStrategy")
    if strategy:
        return strategy
    if cluster.get("NodeProvisioningMode") == CONTINUOUS_PROVISIONING:
        return f"{CONTINUOUS_SLURM_STRATEGY}, continuous provisioning's only strategy"
    return "HyperPod's default strategy"


def describe(template: dict) -> list[str]:
    resources = template.get("Resources", {})
    lines = [f"  {len(resources)} resources:"]
    for kind, count in sorted(Counter(r["Type"] for r in resources.values()).items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"    {count:3d}  {kind}")
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::SageMaker::Cluster":
            strategy = slurm_strategy(props)
            lines.append(
                f"  cluster {props.get('ClusterName')} (Slurm, {strategy}, recovery {props.get('NodeRecovery', '?')}):"
            )
            for group in props.get("InstanceGroups", []):
                slurm = group.get("SlurmConfig", {})
                partition = ",".join(slurm.get("PartitionNames", [])) or "-"
                capacity = "spot" if "Spot" in group.get("CapacityRequirements", {}) else "on-demand"
                plan = group.get("TrainingPlanArn", "")
                lines.append(
                    f"    {group['InstanceGroupName']:<12} {slurm.get('NodeType', '?'):<10} "
                    f"{group.get('InstanceType')} x{group['InstanceCount']}  partition {partition}  {capacity}"
                    + (f", training plan {plan.rsplit('/', 1)[-1]}" if plan else "")
                )
        elif resource["Type"] == "AWS::FSx::FileSystem":
            lustre = props.get("LustreConfiguration", {})
            lines.append(
                f"  fsx: Lustre {props.get('FileSystemTypeVersion')} {lustre.get('DeploymentType')} "
                f"{props.get('StorageCapacity')} GiB, {lustre.get('PerUnitStorageThroughput')} MB/s/TiB, "
                f"compression {lustre.get('DataCompressionType', 'NONE')}"
            )
        elif resource["Type"] == "AWS::FSx::DataRepositoryAssociation":
            policies = props.get("S3", {})
            modes = [
                m for m, key in (("import", "AutoImportPolicy"), ("export", "AutoExportPolicy")) if key in policies
            ]
            lines.append(
                f"    link {props.get('FileSystemPath')} <-> bucket prefix "
                f"{_last_literal(props.get('DataRepositoryPath'))} ({'+'.join(modes)})"
            )
    outputs = template.get("Outputs", {})
    lines.append(f"  outputs: {', '.join(outputs)}")
    return lines


def _last_literal(value: object) -> str:
    """The literal tail of an Fn::Join (the bucket name is a Ref until deploy)."""
    if isinstance(value, dict) and "Fn::Join" in value:
        parts = value["Fn::Join"][1]
        return str(parts[-1]) if isinstance(parts[-1], str) else "?"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stacks.summary", description=__doc__.splitlines()[0])
    parser.add_argument("cdk_out", type=Path, help="the cloud assembly folder written by `cdk synth` (cdk.out)")
    args = parser.parse_args(argv)
    artifacts = stack_artifacts(args.cdk_out) if args.cdk_out.is_dir() else []
    if not artifacts:
        print(
            f"error: no synthesized stacks under {args.cdk_out}: run `make synth` (or `npx cdk synth`) first",
            file=sys.stderr,
        )
        return 2
    errors = 0
    for template_path, region in artifacts:
        regions = sorted({BASE_LINT_REGION, region})
        matches = lint_template(template_path, regions)
        errors += sum(is_error(m) for m in matches)
        print(
            f"{template_path.name} (region {region}): cfn-lint {'/'.join(regions)}: "
            f"{sum(is_error(m) for m in matches)} errors, {sum(not is_error(m) for m in matches)} other findings"
        )
        for match in matches:
            print(f"  {match.rule.id} {match.message} ({'/'.join(str(p) for p in match.path)})")
        print("\n".join(describe(json.loads(template_path.read_text()))))
    if errors:
        print(f"error: cfn-lint found {errors} errors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
