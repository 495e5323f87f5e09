"""Draw the architecture from the synthesized CloudFormation templates (never by hand).

    python tools/diagram.py cdk.out docs/architecture     # writes architecture.dot and .svg

The graph keeps the resources a reader cares about (network, storage, cluster, uploads), places
them inside the VPC/subnet they reference, and draws an edge for every Ref/GetAtt between kept
resources, so the picture changes exactly when the templates do. Needs Graphviz's `dot`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

# CloudFormation type -> (short label, fill colour). Anything else is left out of the picture.
KEPT = {
    "AWS::EC2::VPC": ("VPC", "#e8f1fb"),
    "AWS::EC2::Subnet": ("Subnet", "#f4f8fd"),
    "AWS::EC2::InternetGateway": ("Internet gateway", "#d6e6f5"),
    "AWS::EC2::NatGateway": ("NAT gateway", "#d6e6f5"),
    "AWS::EC2::VPCEndpoint": ("S3 gateway endpoint", "#d6e6f5"),
    "AWS::EC2::FlowLog": ("VPC flow log", "#eeeeee"),
    "AWS::EC2::SecurityGroup": ("Security group (self-referencing, EFA)", "#fde9d9"),
    "AWS::FSx::FileSystem": ("FSx for Lustre", "#dff3e3"),
    "AWS::FSx::DataRepositoryAssociation": ("Data repository association", "#eef9f0"),
    "AWS::S3::Bucket": ("S3 bucket", "#fff4cc"),
    "AWS::IAM::Role": ("IAM role", "#f3e5f5"),
    "AWS::SageMaker::Cluster": ("SageMaker HyperPod cluster", "#ffe0b2"),
    "Custom::CDKBucketDeployment": ("Upload", "#fff9e0"),
}
IMAGE_NODE = "TrainingImage"
FILLED = 'style="rounded,filled"'


def load_templates(cdk_out: Path) -> dict[str, dict]:
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    templates = {}
    for name, artifact in manifest["artifacts"].items():
        if artifact.get("type") == "aws:cloudformation:stack":
            templates[name] = json.loads((cdk_out / artifact["properties"]["templateFile"]).read_text())
    if not templates:
        raise SystemExit(f"error: no stack templates in {cdk_out}; run `make synth` first")
    return templates


def references(value) -> set[str]:
    """Logical ids referenced anywhere inside a property value."""
    found: set[str] = set()
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            found.add(target[0] if isinstance(target, list) else str(target).split(".")[0])
        for item in value.values():
            found |= references(item)
    elif isinstance(value, list):
        for item in value:
            found |= references(item)
    return found


def kept_resources(template: dict) -> dict[str, dict]:
    resources = template.get("Resources", {})
    kept = {}
    for logical_id, resource in resources.items():
        if resource["Type"] not in KEPT:
            continue
        kept[logical_id] = resource
    # Of the roles, only the cluster's execution role belongs in the picture (not CDK's helper roles).
    cluster_refs = set()
    for resource in kept.values():
        if resource["Type"] == "AWS::SageMaker::Cluster":
            cluster_refs |= references(resource.get("Properties", {}))
    return {i: r for i, r in kept.items() if r["Type"] != "AWS::IAM::Role" or i in cluster_refs}


def uses_image(value) -> bool:
    """True when a property value carries the training image's URI (the CDK container-asset repository)."""
    return "container-assets" in json.dumps(value)


def label(logical_id: str, resource: dict) -> str:
    kind, _ = KEPT[resource["Type"]]
    props = resource.get("Properties", {})
    lines = [kind]
    if resource["Type"] == "AWS::EC2::Subnet":
        public = props.get("MapPublicIpOnLaunch")
        lines = ["Public subnet" if public else "Private subnet"]
        if isinstance(props.get("CidrBlock"), str):
            lines.append(props["CidrBlock"])
    elif resource["Type"] == "AWS::EC2::VPC" and isinstance(props.get("CidrBlock"), str):
        lines.append(props["CidrBlock"])
    elif resource["Type"] == "AWS::FSx::FileSystem":
        lustre = props.get("LustreConfiguration", {})
        lines.append(f"{lustre.get('DeploymentType', '')} {props.get('StorageCapacity', '')} GiB")
    elif resource["Type"] == "AWS::FSx::DataRepositoryAssociation":
        path = props.get("FileSystemPath", "")
        s3 = props.get("S3", {})
        modes = ("import" if "AutoImportPolicy" in s3 else "") + (" + export" if "AutoExportPolicy" in s3 else "")
        lines = [f"{path} ({modes.strip(' +')})"]
    elif resource["Type"] == "AWS::SageMaker::Cluster":
        for group in props.get("InstanceGroups", []):
            node_type = group.get("SlurmConfig", {}).get("NodeType", "")
            name, count, instance_type = (group.get(k) for k in ("InstanceGroupName", "InstanceCount", "InstanceType"))
            lines.append(f"{name}: {count} x {instance_type} {node_type}")
    elif resource["Type"] == "Custom::CDKBucketDeployment":
        prefix = props.get("DestinationBucketKeyPrefix", "")
        lines = [f"Upload to /{prefix}" if isinstance(prefix, str) else "Upload"]
    elif resource["Type"] == "AWS::S3::Bucket":
        lines = [
            "S3 access-log bucket"
            if "Log" in logical_id
            else "S3 bucket (sagemaker-...)\\nlifecycle/ payloads/ datasets/ outputs/"
        ]
    elif resource["Type"] == "AWS::IAM::Role":
        lines = ["Cluster execution role"]
    return "\\n".join(lines)


def subnet_of(resource: dict, subnets: set[str]) -> str | None:
    hits = sorted(references(resource.get("Properties", {})) & subnets)
    return hits[0] if hits else None


def to_dot(templates: dict[str, dict]) -> str:
    out = [
        "digraph architecture {",
        '  graph [rankdir=LR, fontname="Helvetica", fontsize=11, compound=true];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]
    for stack_name, template in sorted(templates.items()):
        kept = kept_resources(template)
        subnets = {i for i, r in kept.items() if r["Type"] == "AWS::EC2::Subnet"}
        vpcs = [i for i, r in kept.items() if r["Type"] == "AWS::EC2::VPC"]
        placed = {
            i: subnet_of(r, subnets) for i, r in kept.items() if i not in subnets and r["Type"] != "AWS::EC2::VPC"
        }
        in_vpc = {
            i
            for i, r in kept.items()
            if r["Type"]
            in ("AWS::EC2::SecurityGroup", "AWS::EC2::InternetGateway", "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog")
        }

        def node(i: str, indent: str, kept: dict = kept) -> str:
            return f'{indent}"{i}" [label="{label(i, kept[i])}", fillcolor="{KEPT[kept[i]["Type"]][1]}"];'

        out.append(f'  subgraph "cluster_{stack_name}" {{ label="stack {stack_name}"; style=dashed;')
        for vpc in vpcs:
            out.append(
                f'    subgraph "cluster_{vpc}" {{ label="{label(vpc, kept[vpc])}"; {FILLED}; fillcolor="#f7fbff";'
            )
            for subnet in sorted(subnets):
                subnet_label = label(subnet, kept[subnet])
                out.append(
                    f'      subgraph "cluster_{subnet}" {{ label="{subnet_label}"; {FILLED}; fillcolor="#ffffff";'
                )
                out.extend(node(i, "        ") for i, s in sorted(placed.items()) if s == subnet and i not in in_vpc)
                out.append("      }")
            out.extend(node(i, "      ") for i in sorted(in_vpc) if placed.get(i) is None or i in in_vpc)
            out.append("    }")
        out.extend(node(i, "    ") for i, s in sorted(placed.items()) if s is None and i not in in_vpc)
        image_users = sorted(i for i, r in kept.items() if uses_image(r.get("Properties", {})))
        if image_users:
            out.append(f'    "{IMAGE_NODE}" [label="ECR training image\\n(Neuron SDK 2.26.1)", fillcolor="#e1f5fe"];')
        out.append("  }")
        out.extend(f'  "{user}" -> "{IMAGE_NODE}";' for user in image_users)
        for source, resource in sorted(kept.items()):
            if resource["Type"] in ("AWS::EC2::Subnet", "AWS::EC2::VPC"):
                continue
            for target in sorted(references(resource.get("Properties", {})) & set(kept)):
                if kept[target]["Type"] in ("AWS::EC2::Subnet", "AWS::EC2::VPC"):
                    continue  # placement already shows it
                out.append(f'  "{source}" -> "{target}";')
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    cdk_out, stem = Path(argv[0]), Path(argv[1])
    dot = to_dot(load_templates(cdk_out))
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".dot").write_text(dot)
    if shutil.which("dot") is None:
        print("error: Graphviz `dot` is not installed (apt-get install graphviz)", file=sys.stderr)
        return 2
    subprocess.run(["dot", "-Tsvg", "-o", str(stem.with_suffix(".svg")), str(stem.with_suffix(".dot"))], check=True)
    print(f"wrote {stem.with_suffix('.dot')} and {stem.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
