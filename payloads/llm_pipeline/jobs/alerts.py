"""The run side of push alerts: a run's state changes, to its alerts file and the stack's alerts topic.

Each alert is one line in <run>/logs/alerts.jsonl (``AlertLine``, what ``hpctl events --run`` reads) and, where the
cluster facts name a topic (HPL_ALERTS_TOPIC_ARN, stacks/alerts.py), one SNS message: its subscribers get it by
e-mail. Publishing never fails a step: without boto3, a grant or the network, the line stays and a warning says why.

States: ``finished`` (the chain's last job completed), ``failed`` (a step failed), ``nan-stop`` (the loss guard
stopped training), ``stalled`` (a training step printed no progress line for HPL_ALERT_STALL_MINUTES).

    python3 -m llm_pipeline.jobs.alerts step-end --state FAILED --exit 1   # env.sh, as every step ends
    python3 -m llm_pipeline.jobs.alerts watch --pid PID --stall-minutes 30  # train.sbatch, beside the step

Stdlib only (boto3 is imported when there is a topic: HyperPod's AMI and the training images have it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from llm_pipeline.jobs import pipeline_status, run_lock
from llm_pipeline.run_files import ALERTS_FILE, NAN_STOP_OPENING, AlertLine, ProgressLine, StepLog

FINISHED, FAILED, NAN_STOP, STALLED = "finished", "failed", "nan-stop", "stalled"
TOPIC_VARIABLE = "HPL_ALERTS_TOPIC_ARN"
STALL_VARIABLE = "HPL_ALERT_STALL_MINUTES"
POLL_S = 30.0  # how often the stall watch reads the step's log


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def publish_to_topic(alert: AlertLine, topic_arn: str, region: str | None) -> None:
    """One SNS message on ``topic_arn``: the subject for the e-mail's title, the alert as the body."""
    import boto3  # only where a topic is configured: the local rehearsal has none

    boto3.client("sns", region_name=region).publish(TopicArn=topic_arn, Subject=alert.subject, Message=alert.to_json())


def raise_alert(
    state: str,
    *,
    run_dir: Path,
    step: str,
    job: str,
    detail: str = "",
    env: Mapping[str, str] | None = None,
    publish: Callable[[AlertLine, str, str | None], None] = publish_to_topic,
) -> AlertLine:
    """Write the alert to the run's alerts file, then publish it where a topic is configured."""
    env = os.environ if env is None else env
    alert = AlertLine(time=_now(), run=str(run_dir), step=step, job=job, state=state, detail=detail)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / ALERTS_FILE, "a", encoding="utf-8") as out:
        out.write(alert.to_json())
    print(f"== alert: {state} ({step}){': ' + detail if detail else ''}", flush=True)
    topic = env.get(TOPIC_VARIABLE, "")
    if topic:
        try:
            publish(alert, topic, env.get("HPL_REGION") or None)
        except Exception as exc:  # boto3's errors, a missing boto3, the network: the line above stays
            print(f"warning: alert not published to {topic} ({type(exc).__name__}: {exc})", file=sys.stderr)
    return alert


def nan_stop_line(log_text: str) -> str:
    """The loss guard's error line in a step's log, or ''."""
    for line in reversed(log_text.splitlines()):
        if line.startswith("error: ") and NAN_STOP_OPENING in line:
            return line.removeprefix("error: ")
    return ""


def step_end_state(state: str, exit_code: int, *, run_dir: Path, step: str, job: str) -> tuple[str, str] | None:
    """(alert state, detail) for a step that ended in ``state`` (env.sh's marker), or None: nothing to tell.
    A completed step tells only when it is the last job of the run's record: the run finished."""
    if state == "FAILED":
        log = run_dir / "logs" / StepLog(step, job).name
        text = log.read_text(errors="replace") if log.is_file() else ""
        reason = nan_stop_line(text)
        return (NAN_STOP, reason) if reason else (FAILED, f"step {step} (job {job}) exited {exit_code}")
    if state == "COMPLETED":
        record = pipeline_status.read_record(run_dir / "logs")
        if record and record[-1].job == job:
            return FINISHED, f"the last step, {step}, completed"
    return None


def newest_progress(log: Path) -> int:
    """The number of progress lines in the step's log so far (0 before the first, or without a log)."""
    return len(ProgressLine.parse_all(log.read_text(errors="replace"))) if log.is_file() else 0


def watch_stall(
    *,
    log: Path,
    stall_s: float,
    alive: Callable[[], bool],
    on_stall: Callable[[float], None],
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """While ``alive()``: a step whose log gained no progress line for ``stall_s`` is stalled; ``on_stall`` is told
    once per stall (with the seconds since the last progress) and again only after progress came back. Returns how
    many stalls it told of."""
    seen, since, told, stalls = newest_progress(log), clock(), False, 0
    while alive():
        sleep(poll_s)
        count = newest_progress(log)
        if count != seen:
            seen, since, told = count, clock(), False
        elif not told and clock() - since >= stall_s:
            on_stall(clock() - since)
            told, stalls = True, stalls + 1
    return stalls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m llm_pipeline.jobs.alerts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    end = sub.add_parser("step-end", help="tell the run's state change as a step ends (env.sh)")
    end.add_argument("--state", required=True, help="the step's final marker state")
    end.add_argument("--exit", type=int, required=True, dest="exit_code")
    watch = sub.add_parser("watch", help="tell a training step that prints no progress line (train.sbatch)")
    watch.add_argument("--pid", type=int, required=True, help="the step script's process: the watch ends with it")
    watch.add_argument("--stall-minutes", type=float, required=True)
    watch.add_argument("--poll-s", type=float, default=POLL_S)
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["HPL_RUN_DIR"])
    step = os.environ.get("HPL_CHAIN_STEP", "")
    job = os.environ.get("SLURM_JOB_ID", "none")
    if args.command == "step-end":
        found = step_end_state(args.state, args.exit_code, run_dir=run_dir, step=step, job=job)
        if found:
            raise_alert(found[0], run_dir=run_dir, step=step, job=job, detail=found[1])
        return 0
    if args.stall_minutes <= 0:
        return 0
    stall_s = args.stall_minutes * 60

    def stalled(quiet_s: float) -> None:
        detail = f"no progress line for {quiet_s / 60:.1f} min (alert_stall_minutes = {args.stall_minutes:g})"
        raise_alert(STALLED, run_dir=run_dir, step=step, job=job, detail=detail)

    log = run_dir / "logs" / StepLog(step, job).name
    watch_stall(
        log=log, stall_s=stall_s, alive=lambda: run_lock.pid_alive(args.pid), on_stall=stalled, poll_s=args.poll_s
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
