"""The launcher's side of an MLflow job run: open it at submit, end it with the app.

Written once against a small store (``find_run``, ``experiment_id``, ``create_run``,
``end_run``) that has two implementations: the REST API (``mlflow_rest``, used in the
launcher's own process for ``http(s)://`` URIs) and ``MlflowClient`` (used by the
detached tracker agent for other stores, e.g. sqlite, where the only client is mlflow's).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Mapping, Optional, Protocol

logger = logging.getLogger(__name__)

TAG_JOB_ID = "torchx.job_id"
TAG_PARENT = "torchx.parent_run_id"
TAG_KIND = "torchx.kind"
DEFAULT_EXPERIMENT = "torchx"
WAIT_FOR_RUN = 120.0
ENDED = ("FINISHED", "FAILED", "KILLED")  # ending a run another process is still opening


class Store(Protocol):
    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str: ...

    def find_run(self, tag: str, value: str) -> Optional[Dict[str, Any]]: ...

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start_ms: int,
    ) -> str: ...

    def end_run(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None: ...


def _info(run: Mapping[str, Any]) -> Mapping[str, Any]:
    return run["info"]


def open_job_run(
    store: Store,
    job_id: str,
    name: str,
    params: Mapping[str, str],
    parent_run_id: Optional[str] = None,
    experiment_name: Optional[str] = None,
    start_ms: Optional[int] = None,
    configured_experiment: Optional[str] = None,
    artifact_location: Optional[str] = None,
    find_existing: bool = True,
) -> str:
    """The MLflow run id of ``job_id``'s run, created unless it exists (never twice; the
    Runner that scheduled a job is its only opener, so it may skip the lookup)."""
    existing = store.find_run(TAG_JOB_ID, job_id) if find_existing else None
    if existing is not None:
        return str(_info(existing)["run_id"])
    tags = {TAG_JOB_ID: job_id, TAG_KIND: "job"}
    exp_id = None
    if parent_run_id:
        tags[TAG_PARENT] = parent_run_id
        parent = store.find_run(TAG_JOB_ID, parent_run_id)
        if parent is not None:
            tags["mlflow.parentRunId"] = str(_info(parent)["run_id"])
            exp_id = str(_info(parent)["experiment_id"])  # stages live with their pipeline
    if exp_id is None:
        exp = configured_experiment or experiment_name or DEFAULT_EXPERIMENT
        exp_id = store.experiment_id(exp, artifact_location)
    start = start_ms if start_ms is not None else int(time.time() * 1000)
    return store.create_run(exp_id, name, tags, params, start)


def close_job_run(
    store: Store, job_id: str, status: str, end_ms: Optional[int] = None, wait: bool = False
) -> bool:
    """End ``job_id``'s run as ``status`` unless it has ended already; False if it has no
    run (after ``WAIT_FOR_RUN`` s when ``wait``: the launcher's agent may be opening it)."""
    deadline = time.monotonic() + (WAIT_FOR_RUN if wait else 0)
    run = store.find_run(TAG_JOB_ID, job_id)
    while run is None and time.monotonic() < deadline:
        time.sleep(0.5)
        run = store.find_run(TAG_JOB_ID, job_id)
    if run is None:
        logger.info("%s has no MLflow run to end", job_id)
        return False
    if _info(run).get("status") in ENDED:  # ended once: keep its first end time
        return True
    store.end_run(str(_info(run)["run_id"]), status, end_ms)
    return True


class ClientStore:
    """``Store`` over an ``MLflowTracker``'s ``MlflowClient``."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.client = tracker.client

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        return str(self.tracker._experiment_id(name))

    def find_run(self, tag: str, value: str) -> Optional[Dict[str, Any]]:
        exp_ids = [e.experiment_id for e in self.client.search_experiments()]
        if not exp_ids:
            return None
        quoted = value.replace("'", "\\'")
        runs = self.client.search_runs(
            exp_ids, filter_string=f"tags.`{tag}` = '{quoted}'", max_results=10
        )
        if not runs:
            return None
        run = min(runs, key=lambda r: r.info.start_time)
        info = run.info
        return {
            "info": {
                "run_id": info.run_id,
                "experiment_id": info.experiment_id,
                "status": info.status,
            }
        }

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start_ms: int,
    ) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(
            experiment_id, start_time=start_ms, tags=dict(tags), run_name=name
        )
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run.info.run_id, params=items[i : i + 100])
        return str(run.info.run_id)

    def end_run(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        self.client.set_terminated(run_id, status, end_time=end_ms)
