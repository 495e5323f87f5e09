"""Gather step (training jobs with several hosts): every host's part of the newest checkpoint onto the
first host, so consolidate there reads all shards.

    python -m llm_pipeline.gather --config run.toml

A training job has no shared file system: with FSDP full fine-tuning on two hosts each rank saves
its own shard (``__<rank>_0.distcp``) on its own host's disk, and consolidate, which runs on the
first host, would find only half of the checkpoint. After train, each other host sends the newest
checkpoint it sealed (weights/checkpoints.py: its files and its seal, the seal last) over the job's
network to the first host, which listens on SM_MASTER_PORT + 1. The first host assembles the whole
checkpoint in scratch (sagemaker_env.gathered_dir: links to its own files, the others' files as they
arrive), outside the synced checkpoint folder, because every part is already in S3, uploaded once by
the host that wrote it; then it checks that checkpoint is complete (every host's seal and every file
they list) and consolidate reads it from there.

Before each train run the hosts agree on the checkpoint to resume from over the same kind of
connection, and the first host sends the others that checkpoint's shared files (agree_on_resume).

On one host there is nothing to gather; on a Slurm cluster the checkpoints folder is on FSx and
every node already sees every shard, so the Slurm chain has no such step.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import time
from pathlib import Path

from llm_pipeline import cli
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.jobs import sagemaker_env
from llm_pipeline.run_files import CHECKPOINT
from llm_pipeline.run_state import discard_after
from llm_pipeline.weights.checkpoints import (
    checkpoint_folders,
    complete_checkpoints,
    has_seals,
    held_steps,
    is_sealed,
    seal_name,
    shared_files,
)

PORT_OFFSET = 1  # above SM_MASTER_PORT, which torchrun's rendezvous used during train
WAIT_S = 1800  # how long the first host waits for the others, and they retry reaching it
CHUNK = 8 << 20
ACK = b"ok"


def say(message: str) -> None:
    print(f"gather: {message}", flush=True)


def newest_sealed_here(checkpoints_dir: Path, node: int) -> Path:
    """The newest checkpoint this host's node has sealed (its own part written and listed)."""
    for _, folder in reversed(checkpoint_folders(checkpoints_dir)):
        if (folder / seal_name(node)).is_file():
            return folder
    raise StepError(f"no checkpoint in {checkpoints_dir} carries this host's seal {seal_name(node)}: did train run?")


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = sock.recv(min(left, CHUNK))
        if not part:
            raise StepError(f"the connection closed with {left} of {size} bytes still to come")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _send_json(sock: socket.socket, value) -> None:
    body = json.dumps(value).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)


def _receive_json(sock: socket.socket):
    (length,) = struct.unpack("!I", _receive_exactly(sock, 4))
    return json.loads(_receive_exactly(sock, length))


def _connect(leader: str, port: int, wait_s: float) -> socket.socket:
    """A connection to the first host, retried until it listens (it may still be in an earlier step)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock = socket.create_connection((leader, port), timeout=30)
            sock.settimeout(wait_s)
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise StepError(f"could not reach the first host {leader}:{port} for {wait_s:.0f} s: {exc}") from None
            time.sleep(2)


def _send_files(sock: socket.socket, folder: Path, names: list[str], *, node: int) -> int:
    """``names`` of ``folder`` over ``sock`` (the header _receive_one reads, then the bytes); bytes sent."""
    files = [(name, (folder / name).stat().st_size) for name in names]
    _send_json(sock, {"node": node, "checkpoint": folder.name, "files": files})
    for name, _ in files:
        with (folder / name).open("rb") as source:
            while chunk := source.read(CHUNK):
                sock.sendall(chunk)
    if _receive_exactly(sock, len(ACK)) != ACK:
        raise StepError(f"the other host did not confirm {folder.name}")
    return sum(size for _, size in files)


def send(folder: Path, *, node: int, leader: str, port: int, wait_s: float = WAIT_S) -> int:
    """Send this host's part of ``folder`` (its seal last) to the first host; bytes sent."""
    seal = folder / seal_name(node)
    with _connect(leader, port, wait_s) as sock:
        return _send_files(sock, folder, [*json.loads(seal.read_text())["files"], seal.name], node=node)


def _receive_one(connection: socket.socket, checkpoints_dir: Path) -> tuple[int, str, int]:
    header = _receive_json(connection)
    folder = checkpoints_dir / Path(header["checkpoint"]).name
    written = 0
    for name, size in header["files"]:
        target = folder / name  # not resolved: a link to this host's own copy is replaced, not followed
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise StepError(f"refusing {name}: outside {folder}")
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        with part.open("wb") as out:
            left = size
            while left:
                chunk = _receive_exactly(connection, min(left, CHUNK))
                out.write(chunk)
                left -= len(chunk)
        part.replace(target)
        written += size
    connection.sendall(ACK)
    return header["node"], folder.name, written


def receive(checkpoints_dir: Path, *, senders: int, port: int, wait_s: float = WAIT_S) -> list[tuple[int, str, int]]:
    """Take one checkpoint part from each of ``senders`` hosts; (node, checkpoint, bytes) per host."""
    received = []
    with socket.create_server(("", port), reuse_port=False) as server:
        server.settimeout(wait_s)
        while len(received) < senders:
            try:
                connection, address = server.accept()
            except TimeoutError:
                raise StepError(
                    f"{len(received)} of {senders} hosts sent their checkpoint within {wait_s:.0f} s"
                ) from None
            with connection:
                connection.settimeout(wait_s)
                node, name, size = _receive_one(connection, checkpoints_dir)
            say(f"node {node} ({address[0]}) sent its part of {name}: {size / 1e6:.1f} MB")
            received.append((node, name, size))
    return received


def agree_on_resume(
    checkpoints_dir: Path,
    hosts: sagemaker_env.JobHosts,
    *,
    resume_dir: Path,
    by_part: bool = True,
    wait_s: float = WAIT_S,
) -> Path | None:
    """Before train on several hosts: the checkpoint this host resumes from, the same step on every
    host (None: every host starts from the base model).

    Each host names the steps whose checkpoint it holds: with ``by_part`` (the torch engine) its own
    node's part complete (its seal and the files it lists; within one job a host's disk holds nothing
    else), else the whole checkpoint complete (each host then resumes from its own folder). The first
    host answers the newest step every host holds; by part, it then sends every other host that
    checkpoint's shared files (checkpoints.shared_files: trainer_state.json, scheduler.pt, the
    .metadata files, an adapter; never a rank's shard), which that host assembles in ``resume_dir``
    (scratch: links to its own files, the received files beside them, so nothing it receives is
    uploaded again) and resumes from there. A rank's optimizer entries
    in another host's files come over the process group at load (training/torch/parallel.py). Every
    host deletes its checkpoint folders newer than the agreed one (incomplete somewhere)."""
    held = held_steps(checkpoints_dir, hosts.rank) if by_part else [s for s, _ in complete_checkpoints(checkpoints_dir)]
    port = hosts.master_port + PORT_OFFSET
    if not hosts.is_leader:
        with _connect(hosts.leader, port, wait_s) as sock:
            _send_json(sock, held)
            agreed = _receive_json(sock)
            if agreed and by_part:
                link_own_part(checkpoints_dir / CHECKPOINT.name(agreed), resume_dir)
                _, name, size = _receive_one(sock, resume_dir)
                say(f"received the shared files of {name} from {hosts.leader}: {size / 1e6:.1f} MB")
        resume = (resume_dir if by_part else checkpoints_dir) / CHECKPOINT.name(agreed)
    else:
        shared, connections = set(held), []
        with socket.create_server(("", port)) as server:
            server.settimeout(wait_s)
            try:
                while len(connections) < len(hosts.hosts) - 1:
                    try:
                        connection, _ = server.accept()
                    except TimeoutError:
                        raise StepError(
                            f"{len(connections)} of {len(hosts.hosts) - 1} hosts named their checkpoints within "
                            f"{wait_s:.0f} s"
                        ) from None
                    connection.settimeout(wait_s)
                    connections.append(connection)
                    shared &= set(_receive_json(connection))
                agreed = max(shared, default=0)
                resume = checkpoints_dir / CHECKPOINT.name(agreed)
                for connection in connections:
                    _send_json(connection, agreed)
                    if agreed and by_part:
                        _send_files(connection, resume, shared_files(resume, node=0), node=0)
            finally:
                for connection in connections:
                    connection.close()
    for folder in discard_after(checkpoints_dir, agreed):
        say(f"discarded {folder}: not complete on every host")
    return resume if agreed else None


def gather(cfg: RunConfig, env: dict[str, str] | None = None) -> None:
    env = dict(os.environ if env is None else env)
    hosts = sagemaker_env.read_hosts(env)
    if len(hosts.hosts) == 1:
        say("one host: its disk holds the whole checkpoint")
        return
    checkpoints_dir = cfg.paths.checkpoints_dir
    port = hosts.master_port + PORT_OFFSET
    if not has_seals(checkpoint_folders(checkpoints_dir)):
        # Written before seals existed: nothing says which host holds which file.
        say("the checkpoints are not sealed (written before seals existed): consolidate reads the first host's files")
        return
    if not hosts.is_leader:
        folder = newest_sealed_here(checkpoints_dir, hosts.rank)
        size = send(folder, node=hosts.rank, leader=hosts.leader, port=port)
        say(f"sent this host's part of {folder.name} to {hosts.leader}: {size / 1e6:.1f} MB")
        return
    newest = newest_sealed_here(checkpoints_dir, 0)
    gathered = sagemaker_env.gathered_dir(env, Path(cfg.paths.output_dir)) / checkpoints_dir.name
    assembled = link_own_part(newest, gathered)
    received = receive(gathered, senders=len(hosts.hosts) - 1, port=port)
    names = {name for _, name, _ in received} | {newest.name}
    if len(names) != 1 or not is_sealed(assembled):
        raise StepError(
            f"the hosts' newest checkpoints differ or are incomplete after gathering ({sorted(names)} in "
            f"{gathered}): rerun the job, which resumes from the newest complete checkpoint"
        )
    say(f"{newest.name} is complete in {gathered}: the seals of all {len(hosts.hosts)} hosts and their files")


def link_own_part(folder: Path, gathered: Path) -> Path:
    """A fresh ``gathered/<checkpoint>`` holding a link to every file of this host's ``folder``."""
    shutil.rmtree(gathered, ignore_errors=True)  # an earlier attempt's, or another checkpoint's
    assembled = gathered / folder.name
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            link = assembled / path.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path.resolve())
    return assembled


def main(argv: list[str] | None = None) -> int:
    return cli.run_config_only_step("gather", __doc__.split("\n\n")[0], gather, argv)


if __name__ == "__main__":
    raise SystemExit(main())
