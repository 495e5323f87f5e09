"""hpctl: operate the deployed HyperPod cluster (status, wait, shell, submit, logs, nodes) and training jobs (job)."""

from __future__ import annotations

import argparse
import sys

from cluster_contract import DEFAULT_STACK_NAME
from hpctl import PACKAGE_CHECKOUT
from llm_pipeline import __version__

try:  # boto3 and the rest: a venv without them gets one line naming the install, not a traceback
    from hpctl.cluster.commands import ROOM as CLUSTER
    from hpctl.common.errors import HpctlError
    from hpctl.common.registry import register_rooms
    from hpctl.jobs.commands import ROOM as JOBS
    from hpctl.nodes.commands import ROOM as NODES
    from hpctl.observe.commands import ROOM as OBSERVE
    from hpctl.runs.commands import ROOM as RUNS
    from hpctl.teams.commands import ROOM as TEAMS
except ModuleNotFoundError as missing:
    raise SystemExit(
        f"error: hpctl needs the Python package {missing.name}, which {sys.prefix} lacks: run `make hpctl` in "
        f"{PACKAGE_CHECKOUT} (requirements-hpctl.txt)"
    ) from None

# The rooms, in the order an operator meets them; the top-level help lists their commands in this order.
ROOMS = (CLUSTER, RUNS, OBSERVE, NODES, JOBS, TEAMS)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("deployment (defaults: cdk.json context, then the AWS defaults)")
    where.add_argument("--stack", help=f"stack name (cdk.json context stack_name, else {DEFAULT_STACK_NAME})")
    where.add_argument("--region", help="AWS region (cdk.json context region, else AWS_REGION / profile)")
    where.add_argument("--profile", help="AWS profile from ~/.aws/config (else AWS_PROFILE / default)")

    parser = argparse.ArgumentParser(
        prog="hpctl",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the grouped command list's lines
    )
    parser.add_argument("--version", action="version", version=f"hpctl {__version__}")
    # The flat list argparse would print is suppressed: the epilog lists the same commands grouped by room. prog:
    # each command's usage reads `hpctl status ...`, not the top-level usage line set above.
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="hpctl")
    parser.epilog = register_rooms(sub, common, ROOMS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.handler(args)  # None, or an exit status of its own (run compare: 1 = no match)
    except HpctlError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
