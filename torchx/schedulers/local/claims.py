"""Claims on an idempotency token for ``local_cwd``, so racing submitters launch one app.

A token's directory (``$TORCHX_HOME/local_cwd/<session>/.tokens/<token>/``) holds numbered
claims ``.claim.N``, each naming the app its claimant is about to launch and the claimant
(pid and stamp). A claim is written to a temporary file, then hard-linked to its name,
which fails if it exists: of all submitters taking claim N, exactly one succeeds.

The highest claim rules the token. If its app exists, it is the token's while live (or
SUCCEEDED and re-attached on request), else stale. If not, it is being launched while
its claimant runs, and stale once the claimant died or gave it up (``.claim.N.void``).
A stale claim N is replaced by claim N+1, so a crashed submitter blocks nobody.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Optional

from torchx.schedulers.local import processes as procs
from torchx.schedulers.local import protocol

CLAIM_PREFIX = ".claim."
VOID_SUFFIX = ".void"
# how long a submitter waits for another claimant to launch before it gives up
LAUNCH_WAIT_SECONDS = 120.0
POLL_SECONDS = 0.005

AppState = Callable[[str], Optional[str]]  # app id -> its state name, None if no such app


class ClaimWaitTimeout(RuntimeError):
    """The claimant of a token neither launched its app nor died in time."""


def _generations(token_dir: str) -> list[int]:
    suffixes = [n[len(CLAIM_PREFIX) :] for n in os.listdir(token_dir) if n.startswith(CLAIM_PREFIX)]
    return [int(gen) for gen in suffixes if gen.isdigit()]


def _path(token_dir: str, gen: int) -> str:
    return os.path.join(token_dir, f"{CLAIM_PREFIX}{gen}")


def _read(token_dir: str, gen: int) -> Dict[str, Any]:
    return json.loads(protocol.read_private(_path(token_dir, gen)))


def _create(token_dir: str, gen: int, doc: Dict[str, Any]) -> bool:
    """Take claim ``gen`` (True), unless another submitter has it (False)."""
    tmp = os.path.join(token_dir, f".tmp-claim.{os.getpid()}.{time.monotonic_ns()}")
    fd = protocol.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.link(tmp, _path(token_dir, gen))  # atomic, and fails if the claim exists
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _verdict(token_dir: str, gen: int, doc: Dict[str, Any], state: AppState, reuse: bool) -> str:
    """``reuse`` (the claim's app is the token's), ``wait`` (being launched) or ``stale``."""

    def by_app(name: str) -> str:
        if name in protocol.TERMINAL:
            return "reuse" if reuse and name == "SUCCEEDED" else "stale"
        return "reuse"

    name = state(doc["app_id"])
    if name is not None:
        return by_app(name)
    if os.path.exists(_path(token_dir, gen) + VOID_SUFFIX):
        return "stale"
    if procs.is_ours(doc.get("pid"), doc.get("stamp")):
        return "wait"
    name = state(doc["app_id"])  # it may have launched just before it died
    return "stale" if name is None else by_app(name)


def claim(token_dir: str, app_id: str, state: AppState, reattach_succeeded: bool) -> Optional[str]:
    """Claim the token for ``app_id``: None if the caller holds it now and must launch
    ``app_id``; else the app id of the claim that rules the token (to re-attach to)."""
    protocol.makedirs_private(token_dir)
    me = {"app_id": app_id, "pid": os.getpid(), "stamp": procs.stamp(os.getpid())}
    deadline = time.monotonic() + LAUNCH_WAIT_SECONDS
    while True:
        gens = _generations(token_dir)
        gen = max(gens, default=0)
        if gen:
            doc = _read(token_dir, gen)
            verdict = _verdict(token_dir, gen, doc, state, reattach_succeeded)
            if verdict == "reuse":
                return str(doc["app_id"])
            if verdict == "wait":
                if time.monotonic() > deadline:
                    raise ClaimWaitTimeout(
                        f"process {doc.get('pid')} claimed this idempotency key for"
                        f" {doc['app_id']} but has not launched it within"
                        f" {LAUNCH_WAIT_SECONDS:.0f} s; retry later, or remove"
                        f" {_path(token_dir, gen)} if it is stuck"
                    )
                time.sleep(POLL_SECONDS)
                continue
        if _create(token_dir, gen + 1, me):
            return None


def release(token_dir: str, app_id: str, state: AppState) -> None:
    """Give up the claim of ``app_id`` if its app was never created (its launch failed)."""
    if not os.path.isdir(token_dir) or state(app_id) is not None:
        return
    for gen in sorted(_generations(token_dir), reverse=True):
        if _read(token_dir, gen).get("app_id") == app_id:
            os.close(protocol.open_private(_path(token_dir, gen) + VOID_SUFFIX))
            return
