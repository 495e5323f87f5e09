"""One function per hpctl command: each reads top to bottom, from the stack down to the node."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3

from cluster_contract import MANAGED_MODE, ObservabilityOutput, StackOutput
from hpctl import observability, run_progress, ssm
from hpctl.cluster import choose_node, describe_cluster, list_nodes, require_usable, ssm_target
from hpctl.cluster_users import check_cluster_user
from hpctl.errors import HpctlError, aws_errors
from hpctl.facts import read_cluster_facts
from hpctl.job_status import pricing_client
from hpctl.lifecycle_logs import find_log_group, show_lifecycle_logs
from hpctl.project import ProjectSettings, read_cdk_context, require_checkout, resolve_settings
from hpctl.run_data import require_in_bucket, upload_dataset
from hpctl.run_files import compare_runs, local_copies, open_tensorboard
from hpctl.stack import StackInfo, describe_stack, require_outputs
from hpctl.status import collect_status, render_json, render_text
from hpctl.step_logs import show_step_logs
from hpctl.submit import (
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
from hpctl.wait import wait_in_service
from llm_pipeline.jobs import capacity


@dataclass(frozen=True)
class Deployment:
    settings: ProjectSettings
    session: boto3.Session
    profile: str | None

    @property
    def region(self) -> str:
        return self.session.region_name

    def stack(self) -> StackInfo:
        return require_outputs(describe_stack(self.session, self.settings.stack_name))


def connect(args: argparse.Namespace) -> Deployment:
    settings = resolve_settings(stack=args.stack, region=args.region, cwd=Path.cwd())
    with aws_errors("start an AWS session"):
        session = boto3.Session(profile_name=args.profile, region_name=settings.region)
    if not session.region_name:
        raise HpctlError("no AWS region: pass --region, set `region` in cdk.json context, or set AWS_REGION")
    return Deployment(settings=settings, session=session, profile=args.profile)


def status(args: argparse.Namespace) -> None:
    deployment = connect(args)
    stack = deployment.stack()
    report = collect_status(deployment.session, stack)
    report["observability"] = observability.health(deployment.session, stack)
    report["run"] = newest_run_status(deployment, stack)
    if args.slurm:
        report["slurm"] = slurm_report(deployment, stack)
    print(render_json(report) if args.json else render_text(report))


def slurm_report(deployment: Deployment, stack: StackInfo) -> dict:
    """Slurm's version and queue on the controller (over SSM), and for each group that scales with runs the
    node-hours it held since its first claim against as many always-on (the chains' usage ledger)."""
    from hpctl.scaling_commands import slurm_activity  # the SSM query; hpctl scale and update-software use it too

    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    activity = slurm_activity(deployment, cluster, stack.output(StackOutput.CONTROLLER_GROUP))
    running = sum(job.state == "RUNNING" for job in activity.jobs)
    now = time.time()
    saved = {}
    for group, usage in sorted(activity.usage.items()):
        held, always_on = capacity.node_hours(usage, now)
        saved[group] = {"held_node_hours": round(held, 3), "always_on_node_hours": round(always_on, 3)}
    return {"version": activity.version, "running": running, "queued": len(activity.jobs) - running, "saved": saved}


def newest_run_status(deployment: Deployment, stack: StackInfo) -> dict | None:
    """The newest run's steps, progress and estimate (with its cost), from the bucket's outputs/."""
    bucket = stack.output(StackOutput.BUCKET_NAME)
    if not bucket:
        return None
    s3 = deployment.session.client("s3")
    with aws_errors(f"read the runs in s3://{bucket}/outputs/"):
        run = run_progress.newest_run(s3, bucket)
        if run is None:
            return None
        found = run_progress.run_progress(s3, bucket, run)
    estimate = found["estimate"]
    if estimate:
        root = deployment.settings.root
        context = read_cdk_context(root) if (root / "cdk.json").is_file() else {}
        instance_type = run_progress.partition_instance_types(context).get(estimate.partition)
        price = run_progress.cluster_price(pricing_client(deployment.session), instance_type, deployment.region)
        found["cost"] = run_progress.describe_cost(estimate.node_hours, instance_type, price)
    return found


def wait(args: argparse.Namespace) -> None:
    deployment = connect(args)
    cluster = wait_in_service(
        deployment.session, deployment.settings.stack_name, timeout_s=args.timeout, interval_s=args.interval
    )
    print(f"cluster {cluster.name} is in service: `hpctl shell` opens a shell on the controller")


def session_request(
    deployment: Deployment, *, group: str | None, node: str | None, ready: bool, command: str | None = None
) -> ssm.SessionRequest:
    """The SSM session for a node of the deployed cluster (the controller unless told otherwise)."""
    stack = deployment.stack()
    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    require_usable(cluster, ready=ready)
    nodes = list_nodes(deployment.session, cluster.name)
    chosen = choose_node(
        nodes, cluster=cluster.name, group=group or stack.output(StackOutput.CONTROLLER_GROUP), instance_id=node
    )
    print(f"session on {chosen.group}/{chosen.instance_id} ({chosen.status})", file=sys.stderr, flush=True)
    return ssm.SessionRequest(
        target=ssm_target(cluster, chosen), region=deployment.region, profile=deployment.profile, command=command
    )


def shell(args: argparse.Namespace) -> None:
    ssm.find_session_tools()  # fail before any AWS call when the local tools are missing
    deployment = connect(args)
    ssm.exec_session(session_request(deployment, group=args.group, node=args.node, ready=False))


def submit(args: argparse.Namespace) -> None:
    if args.from_step and (args.ladder or args.sweep):
        raise HpctlError("--from starts the pipeline at a step: the ladder and the sweep always run whole")
    if args.account and args.sweep:
        raise HpctlError("--account applies to the pipeline and the ladder: the sweep runs under the user's team")
    options = SubmitOptions(
        config="",
        from_step=args.from_step,
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


def logs_lifecycle(args: argparse.Namespace) -> None:
    deployment = connect(args)
    group = find_log_group(deployment.session, stack_name=deployment.settings.stack_name, cluster_name=args.cluster)
    show_lifecycle_logs(deployment.session, group, node=args.node, tail=args.tail, follow=args.follow)


def logs_steps(args: argparse.Namespace) -> None:
    deployment = connect(args)
    bucket = deployment.stack().output(StackOutput.BUCKET_NAME)
    show_step_logs(deployment.session, bucket, run=args.run, log=args.log, tail=args.tail)


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


def metrics(args: argparse.Namespace) -> None:
    if args.endpoint and args.unsigned:  # a plain Prometheus: no stack, region or credentials needed
        promql = observability.PromQL(args.endpoint, None, signed=False)
    else:
        deployment = connect(args)
        endpoint = args.endpoint or observability.endpoint_for(deployment.stack())
        promql = observability.PromQL(endpoint, deployment.session, signed=not args.unsigned)
    print(observability.render_figures(observability.run_figures(promql, args.run)))


def dashboard(args: argparse.Namespace) -> None:
    deployment = connect(args)
    stack = deployment.stack()
    print(
        observability.dashboard_text(
            root=deployment.settings.root,
            mode=observability.mode_of(stack),
            endpoint=stack.output(ObservabilityOutput.METRICS_ENDPOINT),
            region=deployment.region,
        )
    )


def managed_cluster(args: argparse.Namespace):
    """The session and the cluster's ARN of a stack in managed mode, with its cluster InService."""
    deployment = connect(args)
    stack = deployment.stack()
    mode = observability.mode_of(stack)
    if mode != MANAGED_MODE:
        raise HpctlError(
            f"stack {stack.name} has observability = {mode or 'not set'}: AWS's extension is for "
            f"observability = {MANAGED_MODE} (cdk.json, with provisioning = continuous), then `make deploy`"
        )
    cluster = describe_cluster(deployment.session, stack.output(StackOutput.CLUSTER_NAME))
    require_usable(cluster, ready=True)
    return observability.sagemaker_client(deployment.session), cluster.arn


def observability_enable(args: argparse.Namespace) -> None:
    client, cluster_arn = managed_cluster(args)
    print(observability.enable_extension(client, cluster_arn, args.version or observability.EXTENSION_VERSION))


def observability_update(args: argparse.Namespace) -> None:
    client, cluster_arn = managed_cluster(args)
    print(observability.update_extension(client, cluster_arn, args.version))


def doctor(args: argparse.Namespace) -> int:
    from hpctl import doctor as checkup  # loads stacks.config and cfn-lint's tables: only this command needs them

    settings = resolve_settings(stack=args.stack, region=args.region, cwd=Path.cwd())
    context = read_cdk_context(settings.root) if (settings.root / "cdk.json").is_file() else {}
    if args.region:  # the deploy's region is cdk.json's unless told otherwise
        context = {**context, "region": args.region}
    return checkup.run(context=context, profile=args.profile)
