"""Orphaned jobs: live apps whose owner (``torchx.pipelines.owner``) has ended for good.

A job is reaped only on a fact: its owner's orchestrator says the owner ended without
success and will not retry it (the states per orchestrator, the credentials and the URLs
are in docs/orphans.md). Any doubt keeps the job: a missed cancel is reaped later, a wrong
one throws away hours of training. ``cancel_if_owned`` is the one cancel decision on a
job's side: ``torchx reap``, Airflow's listener and ``TorchXOperator.on_kill`` share it.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from torchx.pipelines.owner import Owner, owner_of
from torchx.specs.api import is_terminal

AIRFLOW_DONE = ("failed", "removed", "skipped", "upstream_failed")
# CANCELLING: a user asked for the cancel; Prefect may leave the run there for good
PREFECT_DONE = ("FAILED", "CANCELLED", "CRASHED", "CANCELLING")
KFP_DONE = ("FAILED", "CANCELED")
# per owner kind: the orchestrator's name, the env var with its API URL, how to give one
APIS = {
    "airflow": (
        "Airflow",
        "AIRFLOW_API_URL",
        "pass --airflow_url or set AIRFLOW_API_URL (or [api] base_url in the deployment's"
        " airflow.cfg)",
    ),
    "prefect": ("Prefect", "PREFECT_API_URL", "set PREFECT_API_URL or pass --prefect_url"),
    "kfp": ("KFP", "KF_PIPELINES_ENDPOINT", "pass --kfp_url or set KF_PIPELINES_ENDPOINT"),
}
TIMEOUT = 30.0

logger = logging.getLogger(__name__)


class ReapError(Exception):
    """An owner's state could not be had (refused, bad answer, malformed owner): one line."""


class Unreachable(ReapError):
    """The orchestrator itself cannot be asked (no connection, a timeout, credentials
    refused with 401): no owner of it can be, so it is not asked again in this run."""


@dataclass
class Candidate:
    """A live app with an owner, and what the owner's orchestrator said about it."""

    handle: str
    owner: Owner
    owner_state: str = "?"
    orphan: bool = False
    error: Optional[str] = None  # why the owner could not be asked (then it is kept)

    def line(self) -> str:
        verdict = "ORPHAN" if self.orphan else "kept"
        return f"{verdict} {self.handle} owner: {self.owner.describe()} state: {self.owner_state}"

    def ask(self, orchestrators: Orchestrators) -> None:
        """Ask the owner's state; kept, with the reason, when it cannot be had."""
        try:
            self.owner_state, self.orphan = orchestrators.state(self.owner)
        except ReapError as e:  # one unreachable orchestrator stops no other
            self.owner_state, self.orphan, self.error = "unknown", False, str(e)


def _get_json(url: str, headers: Mapping[str, str], body: Optional[Dict[str, Any]] = None) -> Any:
    """GET (or POST ``body``) ``url``; None on 404; Unreachable when the orchestrator cannot
    be asked (connection, timeout, 401); ReapError on any other failure (this URL's)."""
    data = json.dumps(body).encode() if body is not None else None
    all_headers = {"Content-Type": "application/json", **headers}
    request = urllib.request.Request(url, data, all_headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
            return json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        error = Unreachable if e.code == 401 else ReapError
        raise error(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise Unreachable(f"cannot reach {url}: {reason}") from None
    except (ValueError, http.client.HTTPException) as e:
        raise ReapError(f"{url}: bad answer: {e}") from None


class Orchestrators:
    """Asks owners' orchestrators for their state; remembers logins and unreachable
    orchestrators for the run (an owner's state is asked each time)."""

    def __init__(
        self,
        airflow_url: Optional[str] = None,
        prefect_url: Optional[str] = None,
        kfp_url: Optional[str] = None,
    ):
        self.urls = {"airflow": airflow_url, "prefect": prefect_url, "kfp": kfp_url}
        self._airflow_tokens: Dict[str, str] = {}
        self._down: Dict[str, str] = {}

    def state(self, owner: Owner) -> Tuple[str, bool]:
        """``(state, finished for good)`` of ``owner``; ReapError if it cannot be had (an
        unreachable orchestrator is remembered, so it costs one timeout per run)."""
        where = owner.api or owner.kind
        if where in self._down:
            raise Unreachable(self._down[where])
        # owner_of admits only these kinds (owner.KINDS)
        ask = {"airflow": self._airflow, "prefect": self._prefect, "kfp": self._kfp}[owner.kind]
        try:
            return ask(owner, self._api_url(owner))
        except Unreachable as e:
            self._down[where] = str(e)
            raise

    def _api_url(self, owner: Owner) -> str:
        """The orchestrator's API base URL: the one given, else the owner's, else its env var."""
        name, env, hint = APIS[owner.kind]
        base = self.urls[owner.kind] or owner.api or os.environ.get(env)
        if not base:
            raise ReapError(f"no {name} API URL for {owner.describe()}: {hint}")
        return base.rstrip("/")

    def _airflow_token(self, base: str) -> str:
        if base in self._airflow_tokens:
            return self._airflow_tokens[base]
        token = os.environ.get("AIRFLOW_API_TOKEN", "")
        user = os.environ.get("AIRFLOW_API_USERNAME")
        if not token and user:
            body = {"username": user, "password": os.environ.get("AIRFLOW_API_PASSWORD", "")}
            answer = _get_json(f"{base}/auth/token", {}, body)
            token = str((answer or {}).get("access_token") or "")
            if not token:
                raise Unreachable(f"{base}/auth/token gave no access_token for user {user!r}")
        self._airflow_tokens[base] = token
        return token

    def _airflow(self, owner: Owner, base: str) -> Tuple[str, bool]:
        token = self._airflow_token(base)
        ids = owner.ids
        path = "/".join(
            urllib.parse.quote(str(p), safe="")
            for p in ("dags", ids.get("dag"), "dagRuns", ids.get("run"), "taskInstances")
        )
        path += "/" + urllib.parse.quote(str(ids.get("task")), safe="")
        try:
            map_index = int(ids.get("map", -1))
        except (TypeError, ValueError):
            raise ReapError(f"malformed owner {owner.describe()}: bad map index") from None
        if map_index >= 0:
            path += f"/{map_index}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ti = _get_json(f"{base}/api/v2/{path}", headers)
        if ti is None:
            return "not found", False
        state = str(ti.get("state") or "none")
        return state, state in AIRFLOW_DONE

    def _prefect(self, owner: Owner, base: str) -> Tuple[str, bool]:
        headers = {}
        if os.environ.get("PREFECT_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['PREFECT_API_KEY']}"
        elif os.environ.get("PREFECT_API_AUTH_STRING"):
            auth = base64.b64encode(os.environ["PREFECT_API_AUTH_STRING"].encode()).decode()
            headers["Authorization"] = f"Basic {auth}"
        run = _get_json(f"{base}/flow_runs/{owner.ids.get('flow_run')}", headers)
        if run is None:
            return "not found", False
        state = (run.get("state") or {}).get("type") or "none"
        name = (run.get("state") or {}).get("name") or state
        return (name if name.upper() == state else f"{name} ({state})"), state in PREFECT_DONE

    def _kfp(self, owner: Owner, base: str) -> Tuple[str, bool]:
        if "://" not in base:
            base = f"http://{base}"
        token = os.environ.get("KF_PIPELINES_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        run_id = urllib.parse.quote(str(owner.ids.get("run")), safe="")
        run = _get_json(f"{base}/apis/v2beta1/runs/{run_id}", headers)
        if run is None:
            return "not found", False
        state = str(run.get("state") or "none")
        return state, state in KFP_DONE


def cancel_if_owned(
    runner: Any,
    handle: str,
    is_owner: Callable[[Owner], bool],
    what: str = "its owner",
    why: str = "ended",
    log: Any = logger,  # a Logger, or the orchestrator's adapter of one
) -> bool:
    """Cancel ``handle`` only on facts: it still runs, and the owner stored with it can be
    read, allows a cancel and is one ``is_owner`` recognizes; any doubt keeps it, with a
    warning. ``what`` and ``why`` name the asker and its end for the log. True if cancelled."""
    status = runner.status(handle)
    if status is None or status.is_terminal():
        return False
    app = runner.describe(handle)
    owner = owner_of(app.metadata if app is not None else None)
    if owner is None:
        log.warning("torchx: %s kept: its owner cannot be read", handle)
        return False
    if not owner.cancel:
        log.warning("torchx: %s outlives its task (cancel_on_kill=False)", handle)
        return False
    if not is_owner(owner):
        log.warning("torchx: %s kept: its owner is %s, not %s", handle, owner.describe(), what)
        return False
    log.info("torchx: %s %s while %s runs: cancelling it", what, why, handle)
    runner.cancel(handle)
    return True


def find_candidates(
    runner: Any, schedulers: Iterable[str], orchestrators: Orchestrators
) -> List[Candidate]:
    """Every live app of ``schedulers`` that carries an owner, with its owner's state."""
    found: List[Candidate] = []
    for scheduler in schedulers:
        for app in runner.list(scheduler):
            if is_terminal(app.state):
                continue
            appdef = runner.describe(app.app_handle)
            owner = owner_of(appdef.metadata if appdef is not None else None)
            if owner is None:
                continue
            candidate = Candidate(app.app_handle, owner, "not asked (cancel: false)")
            if owner.cancel:  # else its owner said the job may outlive it
                candidate.ask(orchestrators)
            found.append(candidate)
    return found


def reap(runner: Any, candidates: Iterable[Candidate], orchestrators: Orchestrators) -> List[str]:
    """Cancel the orphans among ``candidates``; their handles. Each owner is asked again
    first: a task cleared (or a run retried) since may have re-attached to the job."""
    cancelled = []
    for c in candidates:
        if not c.orphan:
            continue
        c.ask(orchestrators)
        if not c.orphan:
            continue
        if cancel_if_owned(runner, c.handle, c.owner.__eq__, c.owner.describe(), c.owner_state):
            cancelled.append(c.handle)
    return cancelled
