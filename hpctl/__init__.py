"""hpctl: operate the deployed HyperPod cluster from a laptop (see docs/hpctl.md)."""

from pathlib import Path

# The checkout hpctl is installed from (make's editable install): its cdk.json serves from any working folder.
PACKAGE_CHECKOUT = Path(__file__).resolve().parents[1]
