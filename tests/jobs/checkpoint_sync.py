"""SageMaker's checkpoint sync for a rehearsal's hosts: each host's checkpoint folder against one S3
prefix (a local folder here), as SageMaker documents it (docs/jobs.md cites the pages): at the
start every host gets every object under the prefix; while the job runs, files a host writes or
changes in its folder are uploaded and files it deletes are deleted; objects added later are not
copied to the other hosts. Every upload is recorded with the host that made it, so a test can see a
key written by two hosts.

The real agent's timing is unknown; this one looks every ``interval_s`` and once more at the end, so
a file written and deleted between two looks is missed (checkpoints live longer than that here).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import defaultdict
from pathlib import Path


class CheckpointSync:
    def __init__(self, prefix: Path, folders: dict[str, Path], interval_s: float = 0.5):
        self.prefix = prefix  # stands for s3://<bucket>/outputs/<run>/
        self.folders = folders  # host -> its CheckpointConfig.LocalPath
        self.interval_s = interval_s
        self.writers: dict[str, set[str]] = defaultdict(set)  # key -> hosts that uploaded it
        self._seen: dict[str, dict[str, tuple[int, int]]] = {host: {} for host in folders}

    @staticmethod
    def _files(folder: Path) -> dict[str, tuple[int, int]]:
        found = {}
        for where, _, names in os.walk(folder):  # a folder renamed or deleted meanwhile is skipped
            for name in names:
                path = Path(where) / name
                try:
                    if not path.is_symlink():
                        stat = path.stat()
                        found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
                except FileNotFoundError:  # deleted while we looked: gone at the next look
                    continue
        return found

    def restore(self, *, leave_out: set[str] = frozenset()) -> None:
        """The job's start: every object (but ``leave_out``: a restore cut short) into every host's folder."""
        for host, folder in self.folders.items():
            for path in sorted(self.prefix.rglob("*")) if self.prefix.is_dir() else ():
                key = path.relative_to(self.prefix).as_posix()
                if path.is_file() and key not in leave_out:
                    (folder / key).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, folder / key)
            self._seen[host] = self._files(folder)  # restored, not written: not uploaded again

    def scan(self) -> None:
        for host, folder in self.folders.items():
            now = self._files(folder)
            for key, stamp in list(now.items()):
                if self._seen[host].get(key) != stamp:
                    (self.prefix / key).parent.mkdir(parents=True, exist_ok=True)
                    try:
                        shutil.copy2(folder / key, self.prefix / key)
                    except FileNotFoundError:
                        now.pop(key)
                        continue
                    self.writers[key].add(host)
            for key in self._seen[host].keys() - now.keys():
                (self.prefix / key).unlink(missing_ok=True)
            self._seen[host] = now

    def run_until(self, finished: threading.Event) -> threading.Thread:
        """Scan in the background until ``finished`` is set, then once more."""

        def loop():
            while not finished.wait(self.interval_s):
                self.scan()
            self.scan()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def written_twice(self) -> dict[str, list[str]]:
        return {key: sorted(hosts) for key, hosts in self.writers.items() if len(hosts) > 1}

    def objects(self) -> set[str]:
        return {path.relative_to(self.prefix).as_posix() for path in self.prefix.rglob("*") if path.is_file()}
