"""Stall detection for the kubernetes scheduler: when an app last showed life, and how a
waiter stops it as stalled (``Scheduler.last_activity`` / ``stop_stalled``, used by
``torchx.runner.stall``).

Activity is output: the newest pod log line of any running replica (the API server's
``timestamps=True`` prefix, RFC 3339, written by the kubelet when the container wrote the
line; ``tail_lines=1``), or a container's start or exit for replicas that printed nothing.
Never on doubt: an app that is not RUNNING, any of whose replicas does not run (a gang
reads RUNNING once some pods run, while the others are still Pending and the running ranks
wait quietly in rendezvous; or Volcano restarting the gang), or whose pods or logs cannot
be read gives None.

Stopping keeps the reason WITH THE JOB, so a fresh process's ``describe`` reads it FAILED
with that reason. ``cancel`` deletes the objects, which would lose any annotation, so a
stalled app is stopped without deleting them:

- Indexed Jobs: one patch per Job sets the annotation ``torchx.pytorch.org/failure-reason``
  and ``spec.suspend: true`` together (the Job controller then deletes the active pods and
  creates none); the pods are deleted here too so that the gang stops at once.
- Volcano: a ``bus.volcano.sh/v1alpha1`` ``Command`` with action ``AbortJob`` (what
  ``vcctl job suspend`` sends; deleting pods instead would make Volcano restart the job),
  then the annotation. Abort comes first: if the annotation then fails, the job is
  stopped (read CANCELLED) rather than read FAILED while still running.

``status`` maps any job carrying the annotation to FAILED with the reason as ``msg``,
unless it completed (``Complete`` / ``Completed`` wins: it may complete between the
waiter's RUNNING and the stop, which re-reads the job and leaves an ended one alone); the
objects stay until ``torchx cancel`` (or the user) deletes them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, cast

from torchx.schedulers.kubernetes import logs as kl
from torchx.schedulers.kubernetes import status as ks
from torchx.schedulers.kubernetes.api import KubernetesError, api_errors
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_FAILURE_REASON,
    JOB_TYPE_INDEXED,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
)
from torchx.specs.api import AppState, is_terminal

Obj = Dict[str, Any]

COMMAND_GROUP = "bus.volcano.sh"
COMMAND_VERSION = "v1alpha1"
COMMAND_PLURAL = "commands"
LOG_TIMEOUT_SECONDS = 30


class StallHooks:
    """``last_activity`` / ``stop_stalled`` of ``KubernetesScheduler`` (kept here: the
    scheduler module is at its size limit)."""

    def last_activity(self, app_id: str) -> Optional[float]:
        """Epoch seconds of the newest log line of a running pod (or start); None: cannot tell."""
        return last_activity(cast(Any, self), app_id)

    def stop_stalled(self, app_id: str, reason: str) -> None:
        """Stop the gang without deleting its objects, keeping ``reason`` on them."""
        stop_stalled(cast(Any, self), app_id, reason)


def last_activity(sched: Any, app_id: str) -> Optional[float]:
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        desc = sched.describe(app_id)
        if desc is None or desc.state != AppState.RUNNING:
            return None
        replicas = [r for role in desc.roles_statuses for r in role.replicas]
        if any(r.state != AppState.RUNNING for r in replicas):
            return None  # the running ranks may wait quietly for a pending peer
        namespace, name = app_id.split(":", 1)
        return newest_activity(sched._core(), namespace, sched._pods(namespace, name))
    except (ApiException, HTTPError, KubernetesError):
        return None  # the API cannot tell: never stop on doubt


def newest_activity(core: Any, namespace: str, pods: List[Obj]) -> Optional[float]:
    """The newest of the running pods' last log lines and the pods' container starts and
    exits (raises the client's errors)."""
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        return None
    times = [t for p in pods for t in _container_times(p)]
    for pod in running:
        resp = core.read_namespaced_pod_log(
            pod["metadata"]["name"],
            namespace,
            timestamps=True,
            tail_lines=1,
            _preload_content=False,
            _request_timeout=LOG_TIMEOUT_SECONDS,
        )
        text = resp.data.decode("utf-8", errors="replace")
        times += [t for t in map(_stamp, text.splitlines()) if t is not None]
    return max(times) if times else None


def _container_times(pod: Obj) -> List[float]:
    status = pod.get("status") or {}
    stamps = [status.get("startTime")]
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        stamps += [
            (state.get("running") or {}).get("startedAt"),
            (state.get("terminated") or {}).get("finishedAt"),
        ]
    return [t for t in map(_stamp, (str(s) for s in stamps if s)) if t is not None]


def _stamp(line: str) -> Optional[float]:
    """Epoch seconds of a line's (or a field's) RFC 3339 stamp; None if it has none."""
    parsed = kl.parse_time(line.partition(" ")[0])
    return None if parsed.year == 1 else parsed.timestamp()


@api_errors
def stop_stalled(sched: Any, app_id: str, reason: str) -> None:
    from kubernetes.client.rest import ApiException

    namespace, name = app_id.split(":", 1)
    annotate: Obj = {"metadata": {"annotations": {ANNOTATION_FAILURE_REASON: reason}}}
    job = (
        None
        if sched._kinds.get(app_id) == JOB_TYPE_INDEXED
        else sched._get_volcano(namespace, name)
    )
    # read again: an app that ended since the waiter saw it RUNNING is left as it ended
    if job is not None and is_terminal(ks.volcano_state(job)):
        return
    jobs = [] if job is not None else sched._indexed_jobs(namespace, name)
    if job is None and is_terminal(ks.combine_states([ks.batch_job_state(j)[0] for j in jobs])):
        return
    if job is not None:
        _abort_volcano(sched._custom(), namespace, job, reason)
        sched._custom().patch_namespaced_custom_object(
            VOLCANO_GROUP, VOLCANO_VERSION, namespace, VOLCANO_PLURAL, name, annotate
        )
        return
    for j in jobs:
        body = {**annotate, "spec": {"suspend": True}}
        sched._batch().patch_namespaced_job(j["metadata"]["name"], namespace, body)
    for pod in sched._pods(namespace, name):
        try:
            sched._core().delete_namespaced_pod(
                pod["metadata"]["name"], namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status != 404:
                raise


def _abort_volcano(custom: Any, namespace: str, job: Obj, reason: str) -> None:
    """Ask Volcano's job controller to abort ``job`` (kill its pods, keep the job)."""
    from kubernetes.client.rest import ApiException

    meta = job["metadata"]
    target = {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
    }
    command: Obj = {
        "apiVersion": f"{COMMAND_GROUP}/{COMMAND_VERSION}",
        "kind": "Command",
        "metadata": {"name": f"{meta['name']}-stalled", "namespace": namespace},
        "target": target,
        "action": "AbortJob",
        "reason": "Stalled",
        "message": reason,
    }
    if target["uid"]:  # the command goes when its job is deleted
        command["metadata"]["ownerReferences"] = [target]
    try:
        custom.create_namespaced_custom_object(
            COMMAND_GROUP, COMMAND_VERSION, namespace, COMMAND_PLURAL, command
        )
    except ApiException as e:
        if e.status != 409:  # 409: already asked (an earlier waiter)
            raise
