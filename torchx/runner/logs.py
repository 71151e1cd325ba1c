"""Follow the replicas' logs of an app (the pipeline adapters, ``torchx log``): all at once
with a thread per replica (``each_replica``), or on demand without any (``LogCursor``)."""

from __future__ import annotations

import itertools
import os
import threading
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from torchx.runner.api import Runner
from torchx.schedulers.api import Stream
from torchx.schedulers.local.logs import LogLines, split_text


def replicas_of(
    runner: Runner, handle: str, role: Optional[str] = None, ids: Optional[List[int]] = None
) -> List[Tuple[str, int]]:
    """(role, replica id) pairs of the app, optionally narrowed to one role and some ids."""
    app = runner.describe(handle)
    if app is None:
        return []
    roles = [r for r in app.roles if not role or r.name == role]
    return [(r.name, i) for r in roles for i in range(r.num_replicas) if ids is None or i in ids]


def each_replica(
    replicas: Sequence[Tuple[str, int]], read: Callable[[str, int, int], None]
) -> List[BaseException]:
    """Run ``read(role, replica, index in replicas)`` in a daemon thread per replica; the
    errors they raised, once all ended."""
    errors: List[BaseException] = []

    def run(role: str, k: int, i: int) -> None:
        try:
            read(role, k, i)
        except Exception as e:  # a reader thread's error is handed to the caller to report
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(role, k, i), daemon=True)
        for i, (role, k) in enumerate(replicas)
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.2)  # wakes up for signals (Ctrl-C, SIGTERM)
    return errors


class LogCursor:
    """One replica's log read on demand, with no thread, for a caller that polls many
    replicas from one place (the Airflow triggerer's poller): ``read_new`` takes the whole
    log as it is now and returns the lines it did not return before."""

    def __init__(self, role: str, replica: int, stream: Stream, path: Optional[str] = None) -> None:
        self.role = role
        self.replica = replica
        self.stream = stream
        self.path = path  # the file the log is read from, if known: ``grew`` stats it
        self.seen = 0  # lines returned so far
        self._stat: Optional[Tuple[int, int]] = None

    def grew(self) -> bool:
        """Whether the log may have new lines: its file's size or mtime changed since the
        last call (always True without a known file, or if it cannot be stat'ed)."""
        if self.path is None:
            return True
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        before, self._stat = self._stat, (st.st_size, st.st_mtime_ns)
        return self._stat != before

    def read_new(self, lines: Iterable[str], final: bool = False) -> List[str]:
        """The new lines of ``lines``, without their newlines (a last line still without its
        newline waits for it, unless ``final``)."""
        new = _after(lines, self.seen)
        if new and not final and not new[-1].endswith("\n"):
            new.pop()
        self.seen += len(new)
        return [line.rstrip("\n") for line in new]


def _after(lines: Iterable[str], skip: int) -> List[str]:
    """The lines of ``lines`` after the first ``skip``; a local log is skipped by counting
    newlines in its large blocks rather than line by line."""
    if not isinstance(lines, LogLines):
        return list(itertools.islice(lines, skip, None))
    out: List[str] = []
    for block in lines.blocks():
        if skip:
            count = block.count("\n") + (0 if block.endswith("\n") else 1)
            if count <= skip:
                skip -= count
                continue
            out.extend(split_text(block)[skip:])
            skip = 0
        else:
            out.extend(split_text(block))
    return out
