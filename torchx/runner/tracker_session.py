"""The job's tracker run, owned by the Runner that submits the job: opened before the
submit (its id travels in every role's env), ended by any Runner that sees the app end
(docs/tracking.md)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from torchx.specs.api import AppState, TorchXError
from torchx.specs.errors import backend_errors

if TYPE_CHECKING:  # ``api`` is loaded when a tracker is first used (``backends``)
    from torchx.trackers.api import JobRun, OpenedRun, TrackerBackend

logger = logging.getLogger(__name__)

_RUN_STATUS = {
    AppState.SUCCEEDED: "FINISHED",
    AppState.FAILED: "FAILED",
    AppState.CANCELLED: "KILLED",
}
Trackers = Mapping[str, Optional[str]]
T = TypeVar("T")
# on the run of a keyed submit that lost the key's claim: the handle it re-attached to
REATTACHED_TO_TAG = "torchx.reattached_to"


class TrackerRunError(TorchXError):
    """The job's tracker run could not be opened (nothing was submitted)."""


@dataclass
class OpenedJobRun:
    """The runs one submit opened, one per tracker."""

    runs: List[Tuple[TrackerBackend, OpenedRun]]

    @property
    def env(self) -> Dict[str, str]:
        """What the runs add to every role's env (two MLflow trackers: the first wins)."""
        return {k: v for _, run in reversed(self.runs) for k, v in run.env.items()}


class TrackerSession:
    """A Runner's trackers: each backend built once (its client, its store's engine), used
    for every job the Runner submits or sees end, released by ``close``."""

    def __init__(self) -> None:
        self._backends: Dict[Tuple[str, Optional[str]], TrackerBackend] = {}
        self._lock = threading.Lock()

    def backends(self, trackers: Trackers) -> List[TrackerBackend]:
        with self._lock:
            out = []
            for name, config in trackers.items():
                key = (name, config)
                if key not in self._backends:
                    from torchx.trackers.api import tracker_backend

                    self._backends[key] = tracker_backend(name, config)
                out.append(self._backends[key])
            return out

    def validate(self, trackers: Trackers) -> None:
        for backend in self.backends(trackers):
            backend.validate()

    def open(self, trackers: Trackers, job: JobRun) -> OpenedJobRun:
        """Open the job's run in every tracker; raises ``TrackerRunError`` naming the store."""
        opened = OpenedJobRun([])
        for backend in self.backends(trackers):
            done = False
            try:
                opened.runs.append((backend, backend.open_job_run(job)))
                done = True
            except backend_errors() as e:  # fails the submit as one line
                raise TrackerRunError(
                    f"could not open the job's tracker run in {backend.store}: {error_reason(e)}"
                ) from e
            finally:
                if not done:  # whatever failed, the runs opened so far end (none left RUNNING)
                    self.abort(opened)
        return opened

    def bind(self, opened: OpenedJobRun, handle: str) -> None:
        """The job was submitted as ``handle``: record it on each run (a failure warns)."""
        for backend, run in opened.runs:
            what = f"record {handle} on its tracker run"
            warn_on_error(backend, what, backend.bind_job_run, run.run_id, handle)

    def abort(self, opened: OpenedJobRun) -> None:
        """The submit failed: end the runs it opened as FAILED."""
        for backend, run in opened.runs:
            what = "end the tracker run of a job that was not submitted"
            warn_on_error(backend, what, backend.close_job_run, "", run.run_id, "FAILED")

    def supersede(self, opened: Optional[OpenedJobRun], holder: str, end: bool = True) -> None:
        """Another submitter of the same key launched ``holder`` and this submit re-attached:
        its runs get ``REATTACHED_TO_TAG`` naming the holder and (``end``) end KILLED, as
        nothing failed; ``end=False`` when the caller ends them with the app it cancelled."""
        for backend, run in opened.runs if opened is not None else []:
            what = f"mark the tracker run of a submit that re-attached to {holder}"
            tags = {REATTACHED_TO_TAG: holder}
            warn_on_error(backend, what, backend.log_job_run, run.run_id, {}, 0, tags)
            if end:
                warn_on_error(backend, what, backend.close_job_run, "", run.run_id, "KILLED")

    def close_job_run(
        self, trackers: Trackers, handle: str, env: Mapping[str, str], state: AppState, end_ms: int
    ) -> None:
        """End the job's run with the app's terminal ``state`` at ``end_ms``; a failure is one
        warning."""
        status = _RUN_STATUS.get(state, "FAILED")
        for backend in self.backends(trackers):
            what = f"end the tracker run of {handle} as {status}"
            run_id = backend.job_run_id(handle, env)
            warn_on_error(backend, what, backend.close_job_run, handle, run_id, status, end_ms)

    def close(self) -> None:
        with self._lock:
            for backend in self._backends.values():
                backend.close()
            self._backends.clear()


def warn_on_error(
    backend: TrackerBackend, what: str, call: Callable[..., T], *args: Any
) -> Optional[T]:
    """``call(*args)``; if it fails, one warning ``could not <what> in <store>: <reason>``
    and None: recording on a tracker run is never worth failing a submit or a wait."""
    try:
        return call(*args)
    except backend_errors() as e:
        logger.warning("could not %s in %s: %s", what, backend.store, error_reason(e))
        return None


def error_reason(e: BaseException) -> str:
    """The first line of what went wrong, without a driver's SQL dump."""
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
