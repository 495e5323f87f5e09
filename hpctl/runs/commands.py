"""The `hpctl submit` and `hpctl run` commands: send a run's chain to the cluster (or print it offline), and
compare runs' metrics on this machine; and the room's registration."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from cluster_contract import StackOutput
from hpctl.common import ssm
from hpctl.common.arguments import positive
from hpctl.common.cluster_users import check_cluster_user
from hpctl.common.deployment import connect, session_request
from hpctl.common.errors import HpctlError
from hpctl.common.facts import read_cluster_facts
from hpctl.common.project import require_checkout, resolve_settings
from hpctl.common.registry import Room, RoomCommands
from hpctl.common.run_data import require_in_bucket, upload_dataset
from hpctl.common.run_progress import check_run, list_runs
from hpctl.runs.run_files import compare_runs, local_copies, open_tensorboard
from hpctl.runs.serve import DEFAULT_LOCAL_PORT, ServeOutput, forward, how_to_call, serve_command
from hpctl.runs.submit import (
    SubmitOptions,
    SubmitOutput,
    note_payload_code_age,
    offline_dry_run,
    print_jobs,
    remote_command,
    resolve_run_config,
    send_run_config,
    validate_run_config,
)
from llm_pipeline.compare import DEFAULT_TOLERANCE  # stdlib at import; charts load when it runs
from llm_pipeline.jobs.serve_job import DEFAULT_HOURS
from llm_pipeline.submit import STEPS as PIPELINE_STEPS  # stdlib-only module, shipped with hpctl


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    send = sub.add_parser(
        "submit", parents=[common], help="send a run config (no deploy) and submit its chain on the controller"
    )
    send.add_argument("--config", required=True, help="run config: a path, or a name in payloads/configs/ (default)")
    chain = send.add_mutually_exclusive_group()
    chain.add_argument("--ladder", action="store_true", help="the torchtitan pretraining ladder (docs/pretraining.md)")
    chain.add_argument(
        "--sweep", metavar="NODES", help="the scaling sweep at these node counts, e.g. 1,2,4 (docs/scaling.md)"
    )
    send.add_argument(
        "--from",
        dest="from_step",
        choices=PIPELINE_STEPS,
        metavar="STEP",
        help=f"start the chain at this step ({', '.join(PIPELINE_STEPS)})",
    )
    send.add_argument(
        "--to",
        dest="to_step",
        choices=PIPELINE_STEPS,
        metavar="STEP",
        help="stop the chain after this step, its smoke stage with it (e.g. merge: no generate or evaluate)",
    )
    send.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the smoke stage (every step on <run>/smoke with a few training steps, then the estimate): a "
        "defect in a late step then shows only after the long training",
    )
    send.add_argument(
        "--replace-outputs",
        action="store_true",
        help="a chain that trains into a run folder holding an earlier training's adapter/merged/eval: move them "
        "aside into <run>/replaced/<time>/ first (docs/pipeline.md)",
    )
    send.add_argument(
        "--dry-run", action="store_true", help="offline: validate the config and print the sbatch chain, submit nothing"
    )
    send.add_argument("--account", default="", help="the Slurm account (default: the user's team's; docs/teams.md)")
    send.add_argument("--as-user", default="", metavar="USER", help="submit as this cdk.json user (docs/teams.md)")
    send.set_defaults(handler=submit)

    serve = sub.add_parser(
        "serve",
        parents=[common],
        help="serve a run's tuned model with vLLM on its partition, forwarded to this machine over SSM",
    )
    serve.add_argument("run", metavar="RUN", help="the run (its folder under outputs/)")
    serve.add_argument(
        "--hours", type=positive, default=DEFAULT_HOURS, help=f"the job's time limit (default {DEFAULT_HOURS:g})"
    )
    serve.add_argument(
        "--local-port", type=int, default=DEFAULT_LOCAL_PORT, help=f"this machine's port (default {DEFAULT_LOCAL_PORT})"
    )
    serve.add_argument("--stop", action="store_true", help="cancel the run's serve job instead")
    serve.set_defaults(handler=serve_run)

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
    compare.set_defaults(handler=run_compare)
    board = actions.add_parser(
        "tensorboard", parents=[common], help="bring a run's events and charts down and open TensorBoard on them"
    )
    board.add_argument("runs", nargs=1, metavar="RUN", help=runs)
    board.add_argument("--dest", type=Path, default=Path("hpl-runs"), help="where the run is copied to")
    board.add_argument("--port", type=int, default=6006, help="TensorBoard's port (default 6006)")
    board.add_argument("--print-only", action="store_true", help="download, then print the command instead")
    board.set_defaults(handler=run_tensorboard)


ROOM = Room("runs", "submit a run's chain (or dry-run it), serve its model, compare runs, open TensorBoard", register)


def submit(args: argparse.Namespace) -> None:
    for given, flag in ((args.from_step, "--from"), (args.to_step, "--to")):
        if given and (args.ladder or args.sweep):
            raise HpctlError(f"{flag} names a step of the pipeline: the ladder and the sweep always run whole")
    if args.account and args.sweep:
        raise HpctlError("--account applies to the pipeline and the ladder: the sweep runs under the user's team")
    options = SubmitOptions(
        config="",
        from_step=args.from_step,
        to_step=args.to_step,
        smoke=args.smoke,
        replace_outputs=args.replace_outputs,
        ladder=args.ladder,
        sweep_nodes=args.sweep,
        account=args.account,
        user=args.as_user,
    )
    if args.dry_run:  # offline: no credentials, no session tools
        root = resolve_settings(stack=args.stack, region=args.region, cwd=Path.cwd()).root
        require_checkout(root, "hpctl submit --dry-run")
        if args.as_user:
            check_cluster_user(args.as_user, root)
        local_config = resolve_run_config(args.config, project_root=root)
        to_send = validate_run_config(local_config)
        offline = dataclasses.replace(options, config=str(local_config), dry_run=True)
        offline_dry_run(offline, project_root=root, to_send=to_send)
        return
    ssm.find_session_tools()
    deployment = connect(args)
    if args.as_user:
        check_cluster_user(args.as_user, deployment.settings.root)
    local_config = resolve_run_config(args.config, project_root=deployment.settings.root)
    to_send = validate_run_config(local_config)
    stack = deployment.stack()
    bucket = stack.output(StackOutput.BUCKET_NAME)
    if to_send.dataset_key:
        require_in_bucket(deployment.session, bucket=bucket, key=to_send.dataset_key, what="data.dataset")
    note_payload_code_age(deployment.session, bucket=bucket, project_root=deployment.settings.root)
    facts = read_cluster_facts(deployment.session, bucket)
    request = session_request(deployment, group=None, node=None, ready=True, command=None)
    if to_send.dataset:
        upload_dataset(deployment.session, bucket=bucket, dataset=to_send.dataset)
    sent = send_run_config(deployment.session, bucket=bucket, local=local_config, body=to_send.body)
    command = remote_command(dataclasses.replace(options, config=sent.path), facts=facts, sent=sent)
    output = SubmitOutput()
    session_rc = ssm.run_session(dataclasses.replace(request, command=command), output)
    print_jobs(output.verdict(session_rc=session_rc, dry_run=False))


def serve_run(args: argparse.Namespace) -> None:
    ssm.find_session_tools()  # before any AWS call: both the job and the forwarding go over SSM sessions
    deployment = connect(args)
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME)
    runs = list_runs(deployment.session.client("s3"), bucket)
    check_run(args.run, runs, bucket)
    facts = read_cluster_facts(deployment.session, bucket)
    action = "stop" if args.stop else "submit"
    command = serve_command(
        action,
        run_dir=f"{facts['outputs_dir']}/{args.run}",
        payloads_dir=facts["payloads_dir"],
        user=facts["default_user"],
        hours=None if args.stop else args.hours,
    )
    request = session_request(deployment, group=None, node=None, ready=True, command=None)
    output = ServeOutput()
    output.check(ssm.run_session(dataclasses.replace(request, command=command), output), action)
    if args.stop:
        return
    assert output.endpoint is not None  # check() refuses a submit without one
    print("\n".join(how_to_call(args.run, output.job, args.local_port)), flush=True)
    rc = ssm.forward_port(dataclasses.replace(request, forward=forward(output.endpoint, args.local_port)))
    if rc != 0:
        raise HpctlError(
            f"the port forwarding session ended with aws exit {rc}: the job still runs; `hpctl serve --stop {args.run}`"
        )


def _run_sources(args: argparse.Namespace):
    """(S3 client, the stack's bucket) when a run must come from S3; bucket only for run names."""
    remote = [run for run in args.runs if not Path(run).exists()]
    if not remote:
        return None, None
    deployment = connect(args)
    names_only = any(not run.startswith("s3://") for run in remote)
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME) if names_only else None
    return deployment.session.client("s3"), bucket


def run_compare(args: argparse.Namespace) -> int:
    s3, bucket = _run_sources(args)
    folders = local_copies(args.runs, args.output / "runs", s3, bucket)
    status = compare_runs(
        folders, args.output, by=args.by, steps=args.steps, tolerance=args.tolerance, labels=args.labels
    )
    if status == 2:
        raise HpctlError("compare could not read the runs (the error is above)")
    return status  # 1: a run does not match the reference


def run_tensorboard(args: argparse.Namespace) -> None:
    s3, bucket = _run_sources(args)
    (folder,) = local_copies(args.runs, args.dest, s3, bucket)
    open_tensorboard(folder, args.port, launch=not args.print_only)
