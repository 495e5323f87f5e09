"""Build the CDK app: parse the config, add the stack, turn on cdk-nag. Used by app.py and the tests."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App

from stacks.config import HyperPodConfig, capacity_warnings, lane_warnings, storage_warnings
from stacks.nag import enable_checks
from stacks.stack import HyperPodStack

REPO_ROOT = Path(__file__).resolve().parent.parent


def build_app(
    context: Mapping[str, Any] | None = None,
    *,
    source_root: Path = REPO_ROOT,
    outdir: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[App, HyperPodStack]:
    """``context=None`` takes the CDK CLI's context (cdk.json + ``-c``); tests pass their own.

    ``source_root`` holds lifecycle/ and payloads/ (tests point it at a modified copy).
    """
    app = App(context=dict(context), outdir=outdir) if context is not None else App(outdir=outdir)
    config = HyperPodConfig.from_context(_user_context(app, context), environ=environ)
    for warning in [*lane_warnings(config), *storage_warnings(config), *capacity_warnings(config)]:
        print(f"warning: {warning}", file=sys.stderr)
    stack = HyperPodStack(app, config.stack_name, config=config, source_root=source_root)
    enable_checks(app)
    return app, stack


def _user_context(app: App, context: Mapping[str, Any] | None) -> dict[str, Any]:
    # The CLI hands cdk.json + -c values to the app as context; feature flags ride along and are ignored.
    return dict(context) if context is not None else dict(app.node.get_all_context())
