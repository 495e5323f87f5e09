"""Write a folder completely or not at all.

Work happens in a hidden sibling folder (``.<name>.partial-<host>-<pid>``) on the same file system,
renamed onto the final path only when everything is written. SIGTERM, SIGINT and SIGHUP (Slurm's
scancel, Ctrl-C, a closed terminal) remove the partial folder and end the step with a
CheckpointError; a folder left by a killed run (SIGKILL, a lost node) is removed by the next run
on that host.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

from llm_pipeline.errors import CheckpointError
from llm_pipeline.jobs.run_lock import pid_alive

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
Written = TypeVar("Written")


class Interrupted(BaseException):
    """A termination signal arrived; unwinds the stack so partial output is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


class AtomicOutputDir:
    """Context manager yielding the partial folder; renamed to ``final`` on a clean exit."""

    def __init__(self, final: Path, *, overwrite: bool) -> None:
        self.final = Path(final).absolute()
        self.overwrite = overwrite
        host = socket.gethostname().split(".")[0] or "host"
        self._prefix = f".{self.final.name}.partial-{host}-"
        self.partial = self.final.parent / f"{self._prefix}{os.getpid()}"
        self._old_handlers: dict[int, object] = {}

    def check(self) -> None:
        """Fail early when the final folder is in the way (call before any long work)."""
        if self.final.exists() and not self.final.is_dir():
            raise CheckpointError(f"output {self.final} exists and is not a folder; choose another --output")
        if self.final.is_dir() and any(self.final.iterdir()) and not self.overwrite:
            raise CheckpointError(
                f"output folder {self.final} exists and is not empty; pass --overwrite to replace it "
                "or choose another --output"
            )

    def _remove_stale_partials(self) -> None:
        for path in self.final.parent.glob(f"{self._prefix}*"):
            pid = path.name[len(self._prefix) :].removesuffix(".old")
            if pid.isdigit() and not pid_alive(int(pid)):
                print(f"removing {path} left by an interrupted run", flush=True)
                shutil.rmtree(path, ignore_errors=True)

    def write(self, step: str, build: Callable[[Path], Written]) -> Written:
        """``build(partial folder)``, published when it returns. An OSError on the way (disk full, a
        file changing underneath) publishes nothing and becomes a CheckpointError naming ``step``."""
        try:
            with self as partial:
                return build(partial)
        except OSError as exc:
            raise CheckpointError(f"{step} failed while writing {self.final}: {exc}; nothing was written") from None

    def __enter__(self) -> Path:
        self.check()
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_partials()
        for signum in _SIGNALS:  # before the folder exists, so no signal can strand it
            self._old_handlers[signum] = signal.signal(signum, _raise_interrupted)
        try:
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir()
        except BaseException as exc:
            self._finish(exc)
            raise
        return self.partial

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._finish(exc)
        return False

    def _finish(self, exc: BaseException | None) -> None:
        # Signals wait while the folders are renamed and cleaned; one that came meanwhile is
        # delivered afterwards to the caller's handler.
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            if exc is None:
                self._publish()
        finally:
            shutil.rmtree(self.partial, ignore_errors=True)
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        if isinstance(exc, Interrupted):
            raise CheckpointError(f"interrupted by {exc}; nothing was written to {self.final}") from None

    def _publish(self) -> None:
        self.check()  # the folder may have appeared while we worked
        if self.final.is_dir():
            retired = self.final.parent / f"{self._prefix}{os.getpid()}.old"
            os.rename(self.final, retired)
            os.rename(self.partial, self.final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(self.partial, self.final)
