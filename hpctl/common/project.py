"""Where the deployment is: stack name and region from the command line or the project's cdk.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cluster_contract import DEFAULT_STACK_NAME
from hpctl import PACKAGE_CHECKOUT
from hpctl.common.errors import HpctlError


@dataclass(frozen=True)
class ProjectSettings:
    root: Path  # folder holding cdk.json (or the current folder when there is none)
    stack_name: str
    region: str | None  # None: let boto3 pick its default (AWS_REGION, profile)


def find_project_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that holds a cdk.json, else the checkout hpctl is installed from
    (a run config's own folder, say, is outside the checkout)."""
    for folder in (start, *start.parents, PACKAGE_CHECKOUT):
        if (folder / "cdk.json").is_file():
            return folder
    return None


def require_checkout(root: Path, what: str) -> None:
    """One line when ``what`` needs this project's checkout (cdk.json and payloads/) and there is none."""
    if not (root / "cdk.json").is_file():
        raise HpctlError(
            f"{what} needs this project's checkout (its cdk.json and payloads/): none in {root} or above, nor "
            f"where hpctl is installed from ({PACKAGE_CHECKOUT}): run the checkout's .venv/bin/hpctl"
        )


def read_cdk_context(root: Path) -> dict:
    path = root / "cdk.json"
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HpctlError(f"{path} is not valid JSON: {error}") from error
    context = document.get("context", {})
    if not isinstance(context, dict):
        raise HpctlError(f"{path}: `context` must be an object")
    return context


def resolve_settings(*, stack: str | None, region: str | None, cwd: Path) -> ProjectSettings:
    """Command-line values win over cdk.json context, which wins over the defaults."""
    root = find_project_root(cwd)
    context = read_cdk_context(root) if root else {}
    return ProjectSettings(
        root=root or cwd,
        stack_name=stack or str(context.get("stack_name") or DEFAULT_STACK_NAME),
        region=region or (str(context["region"]) if context.get("region") else None),
    )
