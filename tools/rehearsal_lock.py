"""One rehearsal per work folder at a time: an flock on <folder>/.lock, which holds the holder's pid.

The kernel drops the lock when its holder exits, however it ends, so a killed rehearsal never leaves a
stale lock behind. A second rehearsal on the same folder is refused in one line naming the first's pid;
it deletes nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

LOCK_FILE = ".lock"


def stop_command(pid: str) -> str:
    """The command that stops ``pid`` for the user reading it: through sudo when the holder is another user's
    (a rehearsal runs as root) and the reader is not root."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except (OSError, ValueError):
        owner = os.geteuid()  # gone, or no /proc: a plain kill says what is wrong
    return f"{'sudo ' if owner != os.geteuid() and os.geteuid() != 0 else ''}kill -INT {pid}"


class RehearsalBusy(RuntimeError):
    """Another rehearsal holds the folder; the message names its pid."""


class RehearsalLock:
    def __init__(self, folder: Path, what: str = "rehearsal") -> None:
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_FILE

    def acquire(self) -> RehearsalLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RehearsalBusy(
                f"another {self.what} is running in {self.folder} (pid {holder}): wait for it, or stop it "
                f"with Ctrl-C in its terminal (or `{stop_command(holder)}`)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def wipe(self) -> None:
        """Empty the folder for a fresh run, keeping the lock this process holds."""
        assert self._fd is not None, "acquire() first"
        for entry in self.folder.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def __enter__(self) -> RehearsalLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
