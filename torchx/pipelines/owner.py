"""Who owns a job: the orchestrator's task that submitted it, stored with the job.

``Runner.run(owner=...)`` stores the owner as compact JSON in the app's metadata under
``OWNER``, so any process that can list the scheduler's apps (``torchx reap``, Airflow's
listener) can ask the owner's orchestrator whether it still wants the job, e.g.::

    {"kind":"airflow","api":"http://airflow:8080","dag":"d","run":"r","task":"t","map":-1,"try":1}

``"cancel": false`` (``cancel_on_kill=False``) says the job may outlive its owner.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Protocol

from torchx.schedulers.api import OWNER

KINDS = ("airflow", "prefect", "kfp")


@dataclass(frozen=True)
class Owner:
    """An orchestrator task that owns a job: ``kind`` and its identity ``ids``."""

    kind: str
    ids: Dict[str, Any] = field(default_factory=dict)
    api: Optional[str] = None
    cancel: bool = True  # False: the job may outlive its owner (nobody reaps it)

    def to_metadata(self) -> str:
        doc: Dict[str, Any] = {"kind": self.kind}
        if self.api:
            doc["api"] = self.api
        doc.update(self.ids)
        if not self.cancel:
            doc["cancel"] = False
        return json.dumps(doc, separators=(",", ":"), sort_keys=False)

    def describe(self) -> str:
        """One readable line: ``airflow dag=d run=r task=t map=-1 try=1``."""
        ids = " ".join(f"{k}={v}" for k, v in self.ids.items())
        return f"{self.kind} {ids}".strip()


def owner_of(metadata: Optional[Mapping[str, str]]) -> Optional[Owner]:
    """The owner in an app's metadata (``DescribeAppResponse.metadata``), if any."""
    value = (metadata or {}).get(OWNER)
    if not value:
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
        return None
    kind, api, cancel = str(doc.pop("kind")), doc.pop("api", None), doc.pop("cancel", True)
    return Owner(kind, doc, str(api) if api else None, cancel is not False)


class AirflowTaskInstance(Protocol):
    """What torchx reads of an Airflow task instance: the task SDK's ``RuntimeTaskInstance``
    (in a task process) and the models' ``TaskInstance`` (scheduler, api-server) both have it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: Optional[int]
    try_number: int


def map_index_of(ti: AirflowTaskInstance) -> int:
    """``ti``'s map index, -1 for a task that is not mapped (Airflow may say None)."""
    return -1 if ti.map_index is None else int(ti.map_index)


def airflow_owner(ti: AirflowTaskInstance, cancel: bool = True) -> Owner:
    """The owner of a job submitted by Airflow task instance ``ti``, with Airflow's
    ``[api] base_url`` when it is configured."""
    api: Optional[str] = None
    with contextlib.suppress(ImportError):  # not under Airflow: reap is told the URL instead
        from airflow.configuration import conf

        api = conf.get("api", "base_url", fallback=None) or None
    ids = {
        "dag": ti.dag_id,
        "run": ti.run_id,
        "task": ti.task_id,
        "map": map_index_of(ti),
        "try": int(ti.try_number or 0),
    }
    return Owner("airflow", ids, api.rstrip("/") if api else None, cancel)


def is_airflow_task(owner: Owner, dag_id: str, run_id: str, task_id: str, map_index: Any) -> bool:
    """Whether ``owner`` is that Airflow task instance, in any try (a retry re-attaches to
    the job of an earlier one)."""
    mine = (dag_id, run_id, task_id, -1 if map_index is None else int(map_index))
    ids = owner.ids
    try:
        theirs = (ids.get("dag"), ids.get("run"), ids.get("task"), int(ids.get("map", -1)))
    except (TypeError, ValueError):  # a malformed map index is nobody's
        return False
    return owner.kind == "airflow" and theirs == mine


def current_prefect_owner() -> Optional[Owner]:
    """The owner for a submission from the current Prefect flow run (None outside one)."""
    try:
        from prefect.runtime import flow_run, task_run
    except ImportError:
        return None
    fid, tid = flow_run.get_id(), task_run.get_id()
    if not fid:
        return None
    ids: Dict[str, Any] = {"flow_run": str(fid)}
    if tid:
        ids["task_run"] = str(tid)
    return Owner("prefect", ids, os.environ.get("PREFECT_API_URL") or None)


def kfp_owner(run_id: str, task_name: str) -> Optional[Owner]:
    """The owner of a KFP launcher step (None when KFP left its placeholders)."""
    if not run_id or not task_name or "{{" in run_id + task_name:
        return None
    return Owner("kfp", {"run": run_id, "task": task_name})
