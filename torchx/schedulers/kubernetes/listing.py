"""torchx's apps on a Kubernetes cluster, found by their labels: Volcano Jobs, and the
Indexed Jobs of one app grouped by its unique-name label.

An idempotency token is looked up in every namespace the caller may list, so a retry
finds a keyed app submitted with ``-cfg namespace=...`` (or a ``.torchxconfig``
namespace) while the retrying scheduler's own namespace is another; a user who may not
list cluster-wide (403) is looked up in the scheduler's namespace, as upstream lists.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from torchx.schedulers.api import ListAppResponse
from torchx.schedulers.kubernetes import status as ks
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


def find_apps(custom: Any, batch: Any, namespace: Optional[str], labels: Dict[str, str]) -> Found:
    """(oldest object, entry) of each app whose objects carry ``labels``, in ``namespace``
    (None: every namespace). Raises the client's ``ApiException`` (a 403 among them)."""
    from kubernetes.client.rest import ApiException

    selector = ",".join(f"{k}={v}" for k, v in labels.items())

    def matches(obj: Dict[str, Any]) -> bool:  # also when a server ignores the selector
        return all(labels_of(obj).get(k) == v for k, v in labels.items())

    def where(obj: Dict[str, Any]) -> str:
        return namespace or str((obj.get("metadata") or {}).get("namespace") or "default")

    apps: Found = []
    volcano = (VOLCANO_GROUP, VOLCANO_VERSION)
    try:
        if namespace is None:
            resp = custom.list_cluster_custom_object(
                *volcano, VOLCANO_PLURAL, label_selector=selector
            )
        else:
            resp = custom.list_namespaced_custom_object(
                *volcano, namespace, VOLCANO_PLURAL, label_selector=selector
            )
    except ApiException as e:
        if e.status != 404:  # 404: Volcano not installed
            raise
        resp = {}
    for job in resp.get("items") or []:
        if matches(job):
            app_id = f"{where(job)}:{job['metadata']['name']}"
            apps.append((job, ListAppResponse(app_id, ks.volcano_state(job), name=app_name(job))))
    if namespace is None:
        raw = batch.list_job_for_all_namespaces(label_selector=selector, _preload_content=False)
    else:
        raw = batch.list_namespaced_job(namespace, label_selector=selector, _preload_content=False)
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for job in json.loads(raw.data).get("items") or []:
        if matches(job) and labels_of(job).get(LABEL_UNIQUE_NAME):
            groups.setdefault((where(job), labels_of(job)[LABEL_UNIQUE_NAME]), []).append(job)
    for (ns, name), jobs in groups.items():
        state = ks.combine_states([ks.batch_job_state(j)[0] for j in jobs])
        oldest = min(jobs, key=created)
        apps.append((oldest, ListAppResponse(f"{ns}:{name}", state, name=app_name(oldest))))
    return apps
