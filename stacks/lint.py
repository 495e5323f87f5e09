"""cfn-lint on synthesized templates, with the few warnings this app accepts on purpose."""

from __future__ import annotations

from pathlib import Path

from cfnlint.api import ManualArgs, lint_file
from cfnlint.match import Match

# Each ignored check, and why it is right for this app.
IGNORED_CHECKS = {
    # One AZ by design: FSx PERSISTENT_2 and the Trainium nodes must share the zone that has the
    # capacity, so the zone is a configured value (availability_zone_id), not a lookup.
    "W3010": "availability zone is configured on purpose",
    # CDK turns construct dependencies into DependsOn even where a Ref/GetAtt already orders the
    # resources; the duplicates are harmless and keep the intended order explicit in the code.
    "W3005": "redundant DependsOn emitted by CDK construct dependencies",
}


def lint_template(template: Path, regions: list[str]) -> list[Match]:
    """All cfn-lint findings (errors, warnings, informational) minus the accepted ones."""
    return lint_file(template, ManualArgs(regions=regions, ignore_checks=list(IGNORED_CHECKS)))


def is_error(match: Match) -> bool:
    return match.rule.id.startswith("E")
