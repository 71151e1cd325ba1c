"""torchx's apps in one Kubernetes namespace, found by their labels: Volcano Jobs, and the
Indexed Jobs of one app grouped by its unique-name label.

Only one namespace, the run's (its ``cfg``), never the cluster: two
teams' keys can be equal (the same DAG, task and run id), and a cluster-wide lookup would
re-attach to, or cancel as a race's loser, another team's app.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, List, Tuple

from torchx.schedulers.api import ListAppResponse
from torchx.schedulers.kubernetes import status as ks
from torchx.schedulers.kubernetes.api import tolerating
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_SUBMITTED_AT,
    LABEL_APP_NAME,
    LABEL_UNIQUE_NAME,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
)

Found = List[Tuple[Dict[str, Any], ListAppResponse]]


def labels_of(obj: Dict[str, Any]) -> Dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def created(obj: Dict[str, Any]) -> Tuple[str, int]:
    """(creationTimestamp, submit time in ns): RFC 3339 UTC stamps sort as strings."""
    meta = obj.get("metadata") or {}
    submitted = str((meta.get("annotations") or {}).get(ANNOTATION_SUBMITTED_AT) or "")
    return str(meta.get("creationTimestamp") or ""), int(submitted) if submitted.isdigit() else 0


def app_name(obj: Dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get("torchx.pytorch.org/app-name") or labels_of(obj).get(
        LABEL_APP_NAME, ""
    )


def list_json(method: Any, namespace: str, labels: Dict[str, str]) -> List[Dict[str, Any]]:
    """The items with ``labels`` a namespaced list call returns (also when a server ignores
    the selector), as plain dicts (as the API sent them) rather than models."""
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    resp = method(namespace, label_selector=selector, _preload_content=False)
    items = json.loads(resp.data).get("items") or []
    return [i for i in items if all(labels_of(i).get(k) == v for k, v in labels.items())]


def find_apps(custom: Any, batch: Any, namespace: str, labels: Dict[str, str]) -> Found:
    """(oldest object, entry) of each app in ``namespace`` whose objects carry ``labels``."""
    volcano = functools.partial(
        custom.list_namespaced_custom_object, VOLCANO_GROUP, VOLCANO_VERSION, plural=VOLCANO_PLURAL
    )
    volcano_jobs: List[Dict[str, Any]] = []
    with tolerating(404):  # Volcano not installed
        volcano_jobs = list_json(volcano, namespace, labels)
    apps: Found = []
    for job in volcano_jobs:
        app_id = f"{namespace}:{job['metadata']['name']}"
        apps.append((job, ListAppResponse(app_id, ks.volcano_state(job), name=app_name(job))))
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for job in list_json(batch.list_namespaced_job, namespace, labels):
        if labels_of(job).get(LABEL_UNIQUE_NAME):
            groups.setdefault(labels_of(job)[LABEL_UNIQUE_NAME], []).append(job)
    for name, jobs in groups.items():
        state = ks.combine_states([ks.batch_job_state(j)[0] for j in jobs])
        oldest = min(jobs, key=created)
        apps.append((oldest, ListAppResponse(f"{namespace}:{name}", state, name=app_name(oldest))))
    return apps
