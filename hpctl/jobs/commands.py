"""The `hpctl job ...` commands: the pipeline as a SageMaker training job (no cluster needed); the room's
registration."""

from __future__ import annotations

import argparse

from hpctl.common import run_progress
from hpctl.common.deployment import connect
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.pricing import hourly_price, pricing_client
from hpctl.common.registry import Room, RoomCommands
from hpctl.common.run_progress import OUTPUTS_PREFIX
from hpctl.common.stack import describe_stack
from hpctl.jobs.job_spec import JobOptions, load_run_config, resolve_config_file
from hpctl.jobs.job_status import (
    describe_job,
    follow_logs,
    newest_job,
    render_status,
    show_logs,
    stop_job,
)
from hpctl.jobs.job_submit import JobDeployment, build_spec, create_job, describe_spec
from llm_pipeline.submit import JOB_STEPS


def tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def register(sub: RoomCommands, common: argparse.ArgumentParser) -> None:
    job = sub.add_parser("job", help="the pipeline as a SageMaker training job: submit, status, logs, stop")
    kinds = job.add_subparsers(dest="job_command", required=True, metavar="ACTION")
    submit = kinds.add_parser("submit", parents=[common], help="create a training job for a run config")
    submit.add_argument("--config", required=True, help="run config: a path, or a name in payloads/configs/")
    submit.add_argument("--instance-type", help="overrides job.instance_type")
    submit.add_argument("--instance-count", type=int, help="overrides parallel.nodes")
    submit.add_argument("--spot", action=argparse.BooleanOptionalAction, default=None, help="overrides job.spot")
    submit.add_argument("--max-runtime-hours", type=float, help="overrides job.max_runtime_hours")
    submit.add_argument("--image", help="training image URI (default: the stack's image for the accelerator)")
    submit.add_argument("--role", help="execution role ARN (default: the stack's JobRoleArn output)")
    submit.add_argument(
        "--keep-alive-minutes",
        type=int,
        default=0,
        metavar="M",
        help="warm pool: keep the instances M minutes after the job, so the next matching job starts at once (billed)",
    )
    submit.add_argument("--tag", type=tag, action="append", default=[], metavar="KEY=VALUE", help="extra job tag")
    submit.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the smoke stage the job runs first (a few training steps, save, resume, consolidate, merge, "
        "generate, then the time estimate): a defect in a late step then shows only after the long training",
    )
    submit.add_argument(
        "--to",
        dest="last_step",
        choices=JOB_STEPS,
        metavar="STEP",
        help="stop the job after this step, its smoke stage too (the job's steps: %(choices)s)",
    )
    submit.add_argument("--dry-run", action="store_true", help="check everything and print the job; create nothing")
    submit.set_defaults(handler=job_submit)
    for name, handler, text in (
        ("status", job_status, "status, billable seconds and cost so far"),
        ("logs", job_logs, "the job's CloudWatch log streams"),
        ("stop", job_stop, "stop a running job"),
    ):
        action = kinds.add_parser(name, parents=[common], help=text)
        if name == "stop":  # stopping is never a guess
            action.add_argument("job", help="training job name")
        else:
            action.add_argument("job", nargs="?", help="training job name (default: newest)")
        if name == "logs":
            action.add_argument("--tail", type=int, default=0, metavar="N", help="last N lines per host (0: all)")
            action.add_argument(
                "--follow", action="store_true", help="print new lines of every host until the job ends"
            )
        action.set_defaults(handler=handler)


ROOM = Room("jobs", "the pipeline as a SageMaker training job, no cluster needed", register)


def job_submit(args: argparse.Namespace) -> None:
    if args.instance_count is not None and args.instance_count < 1:
        raise HpctlError(f"--instance-count must be at least 1, got {args.instance_count}")
    deployment = connect(args)
    config_file = resolve_config_file(args.config, project_root=deployment.settings.root)
    options = JobOptions(
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        spot=args.spot,
        max_runtime_hours=args.max_runtime_hours,
        image_uri=args.image,
        role_arn=args.role,
        tags=dict(args.tag),
        keep_alive_minutes=args.keep_alive_minutes,
        smoke=args.smoke,
        last_step=args.last_step,
    )
    cfg = load_run_config(config_file, options)
    stack = describe_stack(deployment.session, deployment.settings.stack_name)
    where = JobDeployment(stack=stack.name, region=deployment.region, outputs=stack.outputs)
    spec = build_spec(cfg, config_file=config_file, options=options, deployment=where, session=deployment.session)
    print(describe_spec(spec))
    if args.dry_run:
        print("dry run: nothing created")
        return
    name = create_job(spec, boto_session=deployment.session)
    print(f"created training job {name}: follow it with `hpctl job status {name}` and `hpctl job logs {name}`")


def job_status(args: argparse.Namespace) -> None:
    deployment = connect(args)
    sagemaker = deployment.session.client("sagemaker")
    job = describe_job(sagemaker, args.job or newest_job(sagemaker))
    instance_type = job.get("ResourceConfig", {}).get("InstanceType", "")
    price = hourly_price(pricing_client(deployment.session), instance_type, deployment.region)
    print(render_status(job, price))
    progress = job_run_progress(deployment.session, job)
    if progress:
        estimate = progress["estimate"]
        cost = run_progress.describe_cost(estimate.node_hours, instance_type, price) if estimate else None
        print("\n".join(run_progress.render(progress, cost)))


def job_run_progress(session, job: dict) -> dict | None:
    """The job's steps, the running step's progress and its smoke estimate, from its checkpoint folder in S3."""
    uri = job.get("CheckpointConfig", {}).get("S3Uri", "")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket or not prefix.startswith(OUTPUTS_PREFIX):
        return None
    run = prefix[len(OUTPUTS_PREFIX) :].strip("/")
    with aws_errors(f"read the run folder {uri}"):
        found = run_progress.run_progress(session.client("s3"), bucket, run)
    return found if found["steps"] else None


def job_logs(args: argparse.Namespace) -> None:
    deployment = connect(args)
    name = args.job or newest_job(deployment.session.client("sagemaker"))
    if args.follow:
        follow_logs(deployment.session, name)
    else:
        show_logs(deployment.session, name, tail=args.tail)


def job_stop(args: argparse.Namespace) -> None:
    deployment = connect(args)
    print(stop_job(deployment.session.client("sagemaker"), args.job))
