"""A ``local_cwd`` app's state as other processes decide it, and its cancel.

The supervisor records the state; this module covers the cases where it cannot:
before it started (a cancel during the launch), and after it died. Such a decision is
written through ``local_files.transition`` under the app's lock, like the supervisor's
own, so whoever reaches a terminal state first wins and that state never changes.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Dict, List, Optional

from torchx.schedulers.local import processes as procs
from torchx.schedulers.local import protocol as files
from torchx.schedulers.local.state import load_state, read_supervisor

logger = logging.getLogger(__name__)

# a request without a supervisor for this long was abandoned by its launcher
LAUNCH_TIMEOUT = 60.0
POLL_SECONDS = 0.01


def finalize(app_dir: str, state: str, msg: str, locked: bool = False) -> Dict[str, Any]:
    """Record a terminal state decided outside the supervisor; returns the state on disk
    (an earlier terminal state wins)."""
    doc = dict(files.current_state(app_dir) or {"replicas": []})
    doc.update({"state": state, "msg": msg, "updated": time.time()})
    if locked:
        return files.transition_locked(app_dir, doc)
    return files.transition(app_dir, doc)


def supervisor_alive(app_dir: str) -> Optional[bool]:
    """True/False once the supervisor published its pid; None before."""
    sup = read_supervisor(app_dir)
    return None if sup is None else procs.is_ours(*sup)


def _recorded_live(doc: Optional[Dict[str, Any]]) -> List[int]:
    """Recorded replica pids that are still the processes recorded (pid and start time)."""
    return [
        r["pid"]
        for r in (doc or {}).get("replicas", [])
        if procs.is_ours(r.get("pid"), r.get("stamp"))
    ]


def state_doc(app_dir: str, request: Dict[str, Any]) -> Dict[str, Any]:
    """The app's state: ``state.json``, unless its supervisor is gone without writing a
    terminal state; then FAILED, recorded once none of its processes runs any more."""
    doc = load_state(app_dir)
    if doc is not None and doc["state"] in files.TERMINAL:
        return doc
    alive = supervisor_alive(app_dir)
    if alive:
        return doc or {"state": "PENDING", "replicas": []}
    if alive is None:
        if time.time() - request["submitted"] < LAUNCH_TIMEOUT:
            return doc or {"state": "PENDING", "replicas": []}
        return finalize(app_dir, "FAILED", "the local supervisor never started")
    doc = load_state(app_dir)  # it may have finished between the two reads
    if doc is not None and doc["state"] in files.TERMINAL:
        return doc
    app_id = os.path.basename(app_dir)
    if _recorded_live(doc) or procs.tagged(f"{app_id}/"):
        return {
            **(doc or {"replicas": []}),
            "state": "RUNNING",
            "msg": "the local supervisor process died; replicas still running",
        }
    return finalize(app_dir, "FAILED", "the local supervisor process died")


def _terminal_on_disk(app_dir: str) -> bool:
    cur = files.current_state(app_dir)
    return cur is not None and cur["state"] in files.TERMINAL


def kill_orphaned(app_dir: str, doc: Optional[Dict[str, Any]]) -> None:
    """Kill what is left of an app whose supervisor is gone: its recorded replicas (if
    pid and start time still match) and every process tagged with the app."""
    procs.kill_tagged_everywhere(f"{os.path.basename(app_dir)}/", _recorded_live(doc))


def cancel(app_dir: str) -> None:
    """Cancel the app and return once it is terminal: within the grace period after its
    supervisor got SIGTERM (at once if it had not started or is gone)."""
    os.close(files.open_private(os.path.join(app_dir, files.CANCEL)))  # for a starting one
    with files.locked(app_dir):
        cur = files.current_state(app_dir)
        if cur is not None and cur["state"] in files.TERMINAL:
            return
        sup = read_supervisor(app_dir)
        if sup is None:  # not started yet: it will find the app cancelled and stop
            finalize(app_dir, "CANCELLED", "cancelled before it started", locked=True)
            return
        if not procs.is_ours(*sup):
            kill_orphaned(app_dir, cur)
            finalize(app_dir, "CANCELLED", "cancelled (its supervisor was gone)", locked=True)
            return
    if procs.is_ours(*sup):
        os.kill(sup[0], signal.SIGTERM)
    deadline = time.monotonic() + files.GRACE_SECONDS + 15
    while time.monotonic() < deadline and procs.is_ours(*sup):
        if _terminal_on_disk(app_dir):
            return
        time.sleep(POLL_SECONDS)
    if _terminal_on_disk(app_dir):  # it wrote its final state and exited
        return
    if procs.is_ours(*sup):
        logger.warning("the supervisor of %s did not stop; killing it and its app", app_dir)
        os.kill(sup[0], signal.SIGKILL)
    kill_orphaned(app_dir, files.current_state(app_dir))
    finalize(app_dir, "CANCELLED", "cancelled (its supervisor was gone)")
