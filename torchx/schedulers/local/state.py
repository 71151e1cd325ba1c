"""Reading a ``local_cwd`` app's files as the scheduler sees them, checked.

A request or state file with content we did not write (``{}``, ``{"state": "BOGUS"}``,
garbage from a full disk or a hand edit) raises ``UnreadableAppError`` naming the file,
so ``status`` says so in one line and ``list`` skips that app with a warning, instead of
a KeyError or TypeError escaping from deep inside.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from torchx.schedulers.local import protocol as files
from torchx.specs.api import TorchXError


class UnreadableAppError(TorchXError):
    """A local app whose files cannot be understood."""

    def __init__(self, app_id: str, path: str, reason: str) -> None:
        super().__init__(
            f"local_cwd app {app_id} is unreadable: {path}: {reason}"
            " (remove its directory if the app is of no use)"
        )
        self.app_id = app_id
        self.path = path


def _load(app_id: str, path: str) -> Optional[Any]:
    try:
        return files.read_json(path)
    except ValueError as e:
        raise UnreadableAppError(app_id, path, str(e)) from None


def _check(app_id: str, path: str, ok: bool, what: str) -> None:
    if not ok:
        raise UnreadableAppError(app_id, path, what)


def load_request(app_dir: str) -> Optional[Dict[str, Any]]:
    """The app's ``request.json`` (None if there is none: no such app)."""
    app_id = os.path.basename(app_dir)
    path = os.path.join(app_dir, files.REQUEST)
    doc = _load(app_id, path)
    if doc is None:
        return None
    _check(app_id, path, isinstance(doc, dict), "not a JSON object")
    app = doc.get("app")
    _check(
        app_id,
        path,
        isinstance(app, dict)
        and isinstance(app.get("name"), str)
        and isinstance(app.get("roles"), list)
        and all(
            isinstance(r, dict)
            and isinstance(r.get("name"), str)
            and isinstance(r.get("num_replicas"), int)
            for r in app["roles"]
        ),
        "no valid 'app' (name and roles)",
    )
    _check(app_id, path, isinstance(doc.get("log_dir"), str), "no 'log_dir'")
    _check(app_id, path, isinstance(doc.get("submitted"), (int, float)), "no 'submitted' time")
    return doc


def load_state(app_dir: str) -> Optional[Dict[str, Any]]:
    """The app's ``state.json`` (None before the supervisor wrote one)."""
    app_id = os.path.basename(app_dir)
    path = os.path.join(app_dir, files.STATE)
    doc = _load(app_id, path)
    if doc is None:
        return None
    _check(app_id, path, isinstance(doc, dict), "not a JSON object")
    _check(
        app_id,
        path,
        files.state_name(doc) is not None,
        f"unknown state {doc.get('state')!r}",
    )
    replicas = doc.get("replicas", [])
    _check(
        app_id,
        path,
        isinstance(replicas, list)
        and all(
            isinstance(r, dict)
            and isinstance(r.get("role"), str)
            and isinstance(r.get("id"), int)
            and r.get("state") in files.STATES
            for r in replicas
        ),
        "bad 'replicas'",
    )
    _check(app_id, path, isinstance(doc.get("msg", ""), str), "bad 'msg'")
    _check(app_id, path, isinstance(doc.get("num_restarts", 0), int), "bad 'num_restarts'")
    return doc


def read_supervisor(app_dir: str) -> Optional[tuple[int, str]]:
    """``(pid, stamp)`` of the app's supervisor; None before it started."""
    try:
        with open(os.path.join(app_dir, files.PID)) as f:
            pid_s, stamp = f.read().split()
        return int(pid_s), stamp
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return (0, "")  # unreadable: treated as a supervisor that is gone
