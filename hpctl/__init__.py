"""hpctl: operate the deployed HyperPod cluster from a laptop (see docs/hpctl.md)."""
