"""An exclusive lock on a run folder while a chain is submitted (stdlib only: the controller's python3).

submit holds it across "does a chain of this run still live?", the sbatch of the whole chain and its record
(<run>/logs/pipeline.json): two submissions of one run that arrive together take turns, and the second finds
the first's chain (jobs/chain.one_chain).

The lock is a file, <run>/logs/submit.lock, that appears whole with its owner in it (written beside it, then
hard-linked into place: link fails when the lock exists, on every POSIX file system, Lustre included). Not
flock: HyperPod mounts FSx with its own options, and with ``localflock`` (or without ``flock``) a flock is
node-local or refused, so two submissions from two nodes would both pass.

A lock whose owner is gone is stale and taken over, so a killed submit needs no manual cleanup: on the owner's
host (and boot), when its pid no longer runs the process that took it; from another host, once it is older
than STALE_S (a submission holds it for seconds). This module alone writes and reads the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llm_pipeline.errors import PipelineError

LOCK_FILE = "submit.lock"  # in the run folder's logs/, beside the record it guards
WAIT_S = 120.0  # a submission (a capacity claim, a few dozen sbatch calls) holds the lock well under this
STALE_S = 600.0  # a lock from another host older than this was left by a killed submit
POLL_S = 0.1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class RunLocked(PipelineError, RuntimeError):
    """Another submission of the run holds the lock, or the lock cannot be made; the message says what to do."""


@dataclass(frozen=True)
class Owner:
    """Who holds a lock: enough to tell, on its host, whether that very process still runs."""

    host: str
    boot: str  # the host's boot id: a pid from before a reboot is no process now
    pid: int
    start: str  # the process's start time (/proc/<pid>/stat): a reused pid is another process
    since: float  # when it took the lock (epoch seconds)

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), _boot_id(), os.getpid(), _start_time(os.getpid()), time.time())

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, for {time.time() - self.since:.0f} s"

    def gone(self, age_s: float) -> bool:
        """The owner no longer holds the lock: its process ended (its host rebooted), or, seen from another host
        (whose processes cannot be looked at), the lock is older than STALE_S."""
        here = Owner.me()
        if self.host != here.host:
            return age_s > STALE_S
        return self.boot != here.boot or not _runs(self.pid, self.start)


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces); "" where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (another user's counts: signalling it is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runs(pid: int, start: str) -> bool:
    if not pid_alive(pid):
        return False
    now = _start_time(pid)
    return not (start and now) or now == start


def _read(path: Path) -> tuple[Owner | None, os.stat_result | None]:
    """The lock's owner (None when unreadable) and the file's stat (None when it is gone)."""
    try:
        with open(path) as file:
            info = os.fstat(file.fileno())
            text = file.read()
    except FileNotFoundError:
        return None, None
    try:
        return Owner(**json.loads(text)), info
    except (ValueError, TypeError):
        return None, info


class RunLock:
    """``with RunLock(logs_dir):`` holds <logs_dir>/submit.lock, waiting up to ``wait_s`` for its holder."""

    def __init__(self, logs_dir: Path, *, wait_s: float = WAIT_S) -> None:
        self.path = Path(logs_dir) / LOCK_FILE
        self.wait_s = wait_s
        self._held: os.stat_result | None = None
        self._made: list[Path] = []

    def acquire(self) -> RunLock:
        self._made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        deadline = time.monotonic() + self.wait_s
        try:
            while not self._take():
                self._wait_for_holder(deadline)
        except OSError as exc:
            self._remove_made()
            raise RunLocked(
                f"cannot lock {self.path} ({exc.strerror or exc}): submit as a user who may write the run folder"
            ) from None
        except BaseException:
            self._remove_made()
            raise
        return self

    def _wait_for_holder(self, deadline: float) -> None:
        """Until the lock is gone or stale (then moved away); RunLocked past ``deadline``."""
        while True:
            owner, info = _read(self.path)
            if info is None:
                return
            age = time.time() - info.st_mtime
            if owner.gone(age) if owner else age > STALE_S:  # unreadable: only its age tells
                self._take_over(info)
                return
            if time.monotonic() > deadline:
                held = owner.describe() if owner else "its owner unreadable"
                raise RunLocked(
                    f"another submission of this run holds {self.path} ({held}): wait for it to end, then submit again"
                )
            time.sleep(POLL_S)

    def _take(self) -> bool:
        """Link a file holding this process as owner into place; False when a lock is there."""
        mine = self.path.with_name(f"{LOCK_FILE}.{socket.gethostname()}.{os.getpid()}")
        self.path.parent.mkdir(parents=True, exist_ok=True)  # again: a refused holder removes the folder it made
        try:
            mine.write_text(json.dumps(asdict(Owner.me())))
        except FileNotFoundError:  # ... just now
            return False
        try:
            os.link(mine, self.path)
        except FileExistsError:
            return False
        finally:
            mine.unlink()
        self._held = os.stat(self.path)
        return True

    def _take_over(self, stale: os.stat_result) -> None:
        """Remove a stale lock, holding the takeover file (made as the lock is) so that no two submissions remove
        a lock at once: with it held, the lock is still the stale one only if no one has removed it since (its
        dead owner cannot), so the check and the removal cannot meet another taker's fresh lock."""
        guard = self.path.with_name(f"{LOCK_FILE}.takeover")
        mine = self.path.with_name(f"{LOCK_FILE}.takeover.{socket.gethostname()}.{os.getpid()}")
        mine.write_text(json.dumps(asdict(Owner.me())))
        try:
            os.link(mine, guard)
        except FileExistsError:
            owner, info = _read(guard)  # held for microseconds: one left behind belongs to a killed taker
            if info is not None and (owner.gone(time.time() - info.st_mtime) if owner else True):
                with contextlib.suppress(FileNotFoundError):
                    guard.unlink()
            return
        finally:
            mine.unlink()
        try:
            with contextlib.suppress(FileNotFoundError):
                if _same(os.stat(self.path), stale):
                    self.path.unlink()
        finally:
            guard.unlink()

    def release(self) -> None:
        """Remove the lock when it is still this one; then the folders acquire made, when empty (a refusal leaves
        no trace)."""
        if self._held is not None:
            with contextlib.suppress(FileNotFoundError):
                if _same(os.stat(self.path), self._held):
                    self.path.unlink()
            self._held = None
        self._remove_made()

    def _remove_made(self) -> None:
        for folder in self._made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        self._made = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    """The same file, not only the same inode number: a removed lock's inode is often reused at once by the next
    lock file made in that folder, which then differs in its change time."""
    return (a.st_dev, a.st_ino, a.st_ctime_ns) == (b.st_dev, b.st_ino, b.st_ctime_ns)
