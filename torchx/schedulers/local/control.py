"""A ``local_cwd`` app seen from outside its supervisor: its state, and its cancel.

Readers also cover what the supervisor cannot record: before it started and after it
died. ``observed_state`` derives that state without writing it, and derives what the
writers will record, so no reader reports a terminal state that a later one contradicts:

- no supervisor ``LAUNCH_TIMEOUT`` s after submission: FAILED (a supervisor starting that
  late records the same and runs nothing);
- the supervisor is dead: RUNNING while a replica of the app still runs, then FAILED.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import List, Optional, Tuple

from torchx.schedulers.local import processes as procs
from torchx.schedulers.local import protocol
from torchx.schedulers.local.protocol import (
    CANCELLED,
    FAILED,
    PENDING,
    RUNNING,
    TERMINAL,
    Request,
    State,
)

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.01
DIED = "the local supervisor process died"


def supervisor_alive(app_dir: str) -> Optional[bool]:
    """True/False once the supervisor published its pid; None before."""
    sup = protocol.read_supervisor(app_dir)
    return None if sup is None else procs.is_ours(*sup)


def _recorded(doc: Optional[State]) -> List[Tuple[Optional[int], Optional[str]]]:
    """``(pid, stamp)`` of each replica in the state."""
    return [(r["pid"], r["stamp"]) for r in (doc.get("replicas", []) if doc else [])]


def _recorded_live(doc: Optional[State]) -> List[int]:
    """Recorded replica pids that are still the processes recorded (owner and start time)."""
    return [pid for pid, stamp in _recorded(doc) if pid is not None and procs.is_ours(pid, stamp)]


def _log_strangers(app_dir: str, recorded: List[Tuple[Optional[int], Optional[str]]]) -> None:
    """Log, once per cancel, the recorded pids now held by another process (another owner
    or start time: a reused pid, or a planted record), which are never signalled."""
    strangers = [
        pid
        for pid, stamp in recorded
        if pid and pid > 0 and procs.alive(pid) and not procs.is_ours(pid, stamp)
    ]
    if strangers:
        logger.warning(
            "%s: pid %s is not the process torchx recorded (another owner or start time);"
            " treated as gone, not signalled",
            app_dir,
            ", ".join(map(str, strangers)),
        )


def _left_running(app_dir: str, doc: Optional[State]) -> bool:
    """Whether a process of the app runs (its supervisor being gone)."""
    return bool(_recorded_live(doc) or procs.tagged(f"{os.path.basename(app_dir)}/"))


def observed_state(app_dir: str, request: Request) -> State:
    """The app's state: ``state.json``, or what it will be where the supervisor cannot
    write it (see the module doc). Reads only; ``BadRecord`` for a bad state file."""
    now = time.time()  # before the pid file is read (see ``supervisor.Supervisor.start``)
    doc = protocol.load_state(app_dir)
    if doc is not None and doc["state"] in TERMINAL:
        return doc
    alive = supervisor_alive(app_dir)
    if alive or (alive is None and now - request["submitted"] <= protocol.LAUNCH_TIMEOUT):
        return doc or {"state": PENDING, "replicas": []}
    if alive is None:
        return protocol.with_state(doc, FAILED, protocol.NEVER_STARTED)
    doc = protocol.load_state(app_dir)  # it may have finished between the two reads
    if doc is not None and doc["state"] in TERMINAL:
        return doc
    if _left_running(app_dir, doc):
        return protocol.with_state(doc, RUNNING, f"{DIED}; replicas still running")
    return protocol.with_state(doc, FAILED, DIED)


def cancel(app_dir: str, request: Request) -> None:
    """Cancel the app and return once it is terminal: within the grace period after its
    supervisor got SIGTERM (at once if it had not started or is gone). An app that
    readers already see ended keeps that state."""
    os.close(protocol.open_private(os.path.join(app_dir, protocol.CANCEL)))  # for a starting one
    with protocol.locked(app_dir):
        cur = protocol.current_state(app_dir)
        if cur is not None and cur["state"] in TERMINAL:
            return
        sup = protocol.read_supervisor(app_dir)
        if sup is None:  # not started yet: it will find the app ended and stop
            protocol.end_unstarted(app_dir, request)
            return
        if not procs.is_ours(*sup):
            _log_strangers(app_dir, [sup, *_recorded(cur)])
            _end_orphaned(app_dir, cur)
            return
    if procs.is_ours(*sup):
        os.kill(sup[0], signal.SIGTERM)
    deadline = time.monotonic() + protocol.GRACE_SECONDS + 15
    while time.monotonic() < deadline and procs.is_ours(*sup):
        if protocol.is_terminal_on_disk(app_dir):
            return
        time.sleep(POLL_SECONDS)
    if protocol.is_terminal_on_disk(app_dir):  # it wrote its final state and exited
        return
    if procs.is_ours(*sup):
        logger.warning("the supervisor of %s did not stop; killing it and its app", app_dir)
        os.kill(sup[0], signal.SIGKILL)
    with protocol.locked(app_dir):
        _end_orphaned(app_dir, protocol.current_state(app_dir))


def _end_orphaned(app_dir: str, cur: Optional[State]) -> None:
    """Cancel an app whose supervisor is gone (the caller holds the lock): CANCELLED once
    what is left of it is killed; FAILED as readers already report it if nothing was."""
    if _left_running(app_dir, cur):
        procs.kill_tagged_everywhere(f"{os.path.basename(app_dir)}/", _recorded_live(cur))
        protocol.finalize(app_dir, CANCELLED, "cancelled (its supervisor was gone)", locked=True)
    else:
        protocol.finalize(app_dir, FAILED, DIED, locked=True)
