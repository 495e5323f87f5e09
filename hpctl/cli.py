"""hpctl: operate the deployed HyperPod cluster (status, wait, shell, submit, logs, nodes) and training jobs (job)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cluster_contract import DEFAULT_STACK_NAME
from hpctl import PACKAGE_CHECKOUT
from llm_pipeline import __version__
from llm_pipeline.compare import DEFAULT_TOLERANCE  # stdlib at import; charts load when it runs
from llm_pipeline.submit import STEPS as PIPELINE_STEPS  # stdlib-only module, shipped with hpctl

try:  # boto3 and the rest: a venv without them gets one line naming the install, not a traceback
    from hpctl import commands, job_commands, node_commands, scaling_commands, secrets, software, team_commands
    from hpctl.errors import HpctlError
except ModuleNotFoundError as missing:
    raise SystemExit(
        f"error: hpctl needs the Python package {missing.name}, which {sys.prefix} lacks: run `make hpctl` in "
        f"{PACKAGE_CHECKOUT} (requirements-hpctl.txt)"
    ) from None


def positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("deployment (defaults: cdk.json context, then the AWS defaults)")
    where.add_argument("--stack", help=f"stack name (cdk.json context stack_name, else {DEFAULT_STACK_NAME})")
    where.add_argument("--region", help="AWS region (cdk.json context region, else AWS_REGION / profile)")
    where.add_argument("--profile", help="AWS profile from ~/.aws/config (else AWS_PROFILE / default)")

    parser = argparse.ArgumentParser(prog="hpctl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hpctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser("status", parents=[common], help="stack outputs, cluster, nodes, FSx and image")
    status.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    status.add_argument(
        "--slurm", action="store_true", help="also ask the controller (SSM) for Slurm's version and queue"
    )
    status.set_defaults(handler=commands.status)

    wait = sub.add_parser("wait", parents=[common], help="wait until the cluster is in service (or failed)")
    wait.add_argument("--timeout", type=positive, default=5400, metavar="SECONDS", help="give up after (default 5400)")
    wait.add_argument("--interval", type=positive, default=30, metavar="SECONDS", help="poll every (default 30)")
    wait.set_defaults(handler=commands.wait)

    shell = sub.add_parser("shell", parents=[common], help="SSM shell on the controller (or another node)")
    target = shell.add_mutually_exclusive_group()
    target.add_argument("--node", metavar="INSTANCE_ID", help="connect to this instance")
    target.add_argument("--group", help="connect to the first running node of this instance group")
    shell.set_defaults(handler=commands.shell)

    submit = sub.add_parser(
        "submit", parents=[common], help="send a run config (no deploy) and submit its chain on the controller"
    )
    submit.add_argument("--config", required=True, help="run config: a path, or a name in payloads/configs/ (default)")
    chain = submit.add_mutually_exclusive_group()
    chain.add_argument("--ladder", action="store_true", help="the torchtitan pretraining ladder (docs/pretraining.md)")
    chain.add_argument(
        "--sweep", metavar="NODES", help="the scaling sweep at these node counts, e.g. 1,2,4 (docs/scaling.md)"
    )
    submit.add_argument(
        "--from",
        dest="from_step",
        choices=PIPELINE_STEPS,
        metavar="STEP",
        help=f"start the chain at this step ({', '.join(PIPELINE_STEPS)})",
    )
    submit.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the smoke stage (every step on <run>/smoke with a few training steps, then the estimate): a "
        "defect in a late step then shows only after the long training",
    )
    submit.add_argument(
        "--replace-outputs",
        action="store_true",
        help="a chain that trains into a run folder holding an earlier training's adapter/merged/eval: move them "
        "aside into <run>/replaced/<time>/ first (docs/pipeline.md)",
    )
    submit.add_argument(
        "--dry-run", action="store_true", help="offline: validate the config and print the sbatch chain, submit nothing"
    )
    submit.add_argument("--account", default="", help="the Slurm account (default: the user's team's; docs/teams.md)")
    submit.add_argument("--as-user", default="", metavar="USER", help="submit as this cdk.json user (docs/teams.md)")
    submit.set_defaults(handler=commands.submit)

    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        help="before a deploy: credentials, region, quotas, zone, Docker, Node.js, CDK, token",
    )
    doctor.set_defaults(handler=commands.doctor)

    logs = sub.add_parser("logs", help="lifecycle logs (CloudWatch) or pipeline step logs (S3)")
    kinds = logs.add_subparsers(dest="kind", required=True, metavar="KIND")
    lifecycle = kinds.add_parser("lifecycle", parents=[common], help="node lifecycle script logs")
    lifecycle.add_argument("--node", metavar="INSTANCE_ID_OR_GROUP", help="only this instance or instance group")
    lifecycle.add_argument(
        "--cluster", metavar="NAME", help="cluster name, when the stack is gone (default: the stack's cluster)"
    )
    lifecycle.add_argument("--tail", type=count, default=0, metavar="N", help="last N lines per node (0: all)")
    lifecycle.add_argument("--follow", "-f", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    lifecycle.set_defaults(handler=commands.logs_lifecycle)
    steps = kinds.add_parser("steps", parents=[common], help="pipeline step logs of a run")
    steps.add_argument("run", nargs="?", help="run folder under outputs/ (omit to list runs)")
    steps.add_argument("log", nargs="?", help="log file, or a step name for its newest log (omit to list)")
    steps.add_argument("--tail", type=count, default=0, metavar="N", help="last N lines (0: all)")
    steps.set_defaults(handler=commands.logs_steps)
    add_run_parsers(sub, common)
    add_observability_parsers(sub, common)
    node_commands.add_parsers(sub, common)
    secrets.add_parsers(sub, common)
    job_commands.add_parsers(sub, common)
    team_commands.add_parsers(sub, common)
    scaling_commands.add_parsers(sub, common)
    software.add_parsers(sub, common)
    return parser


def add_run_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    runs = "a local run folder, s3://bucket/prefix, or a run name under the stack's outputs/"
    run = sub.add_parser("run", help="a run's metrics on this machine: compare runs, open TensorBoard")
    actions = run.add_subparsers(dest="run_command", required=True, metavar="ACTION")
    compare = actions.add_parser(
        "compare", parents=[common], help="overlay runs' loss curves: chart, table, match within a tolerance"
    )
    compare.add_argument("runs", nargs="+", metavar="RUN", help=f"{runs}; the first is the reference")
    compare.add_argument("--output", type=Path, default=Path("compare"), help="folder for the chart and table")
    compare.add_argument("--by", choices=("step", "tokens"), default="step", help="align by step or tokens seen")
    compare.add_argument("--steps", type=int, help="compare over the reference's first N steps")
    compare.add_argument(
        "--tolerance", type=positive, default=DEFAULT_TOLERANCE, help="max relative difference that matches"
    )
    compare.add_argument("--labels", help="comma-separated names for the runs")
    compare.set_defaults(handler=commands.run_compare)
    board = actions.add_parser(
        "tensorboard", parents=[common], help="bring a run's events and charts down and open TensorBoard on them"
    )
    board.add_argument("runs", nargs=1, metavar="RUN", help=runs)
    board.add_argument("--dest", type=Path, default=Path("hpl-runs"), help="where the run is copied to")
    board.add_argument("--port", type=int, default=6006, help="TensorBoard's port (default 6006)")
    board.add_argument("--print-only", action="store_true", help="download, then print the command instead")
    board.set_defaults(handler=commands.run_tensorboard)


def add_observability_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    metrics = sub.add_parser("metrics", parents=[common], help="a run's latest figures from the metrics workspace")
    metrics.add_argument("run", metavar="RUN", help="the run's name (its run folder under outputs/)")
    metrics.add_argument(
        "--endpoint", help="another Prometheus HTTP API (default: the stack's MetricsEndpoint, AMP with SigV4)"
    )
    metrics.add_argument("--unsigned", action="store_true", help="send no SigV4 signature (a plain Prometheus)")
    metrics.set_defaults(handler=commands.metrics)
    board = sub.add_parser("dashboard", parents=[common], help="where the dashboard is and how to open it")
    board.set_defaults(handler=commands.dashboard)
    extension = sub.add_parser("observability", help="observability = managed: AWS's cluster extension")
    actions = extension.add_subparsers(dest="observability_command", required=True, metavar="ACTION")
    enable = actions.add_parser("enable", parents=[common], help="install sagemaker-observability on the cluster")
    enable.add_argument("--version", help="the extension version (default: the one hpctl was tested with)")
    enable.set_defaults(handler=commands.observability_enable)
    update = actions.add_parser(
        "update", parents=[common], help="list sagemaker-observability's versions; --version moves the cluster to one"
    )
    update.add_argument("--version", help="the version to move to (default: only list them)")
    update.set_defaults(handler=commands.observability_update)


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
