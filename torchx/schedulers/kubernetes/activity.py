"""Stall detection for the kubernetes scheduler: when an app last showed life, and how a
waiter stops it as stalled (what ``KubernetesScheduler.last_activity`` / ``stop_stalled``
do with the objects they read, for ``torchx.runner.stall``).

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

from typing import Any, Callable, Dict, List, Optional

from torchx.schedulers.api import DescribeAppResponse
from torchx.schedulers.kubernetes import logs as kl
from torchx.schedulers.kubernetes import status as ks
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_FAILURE_REASON,
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


def all_running(desc: Optional[DescribeAppResponse]) -> bool:
    """Whether the app and every replica of it run (the running ranks of a gang may wait
    quietly for a pending peer: no stall then)."""
    if desc is None or desc.state != AppState.RUNNING:
        return False
    return all(r.state == AppState.RUNNING for role in desc.roles_statuses for r in role.replicas)


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


def suspend_indexed(
    batch: Any,
    core: Any,
    namespace: str,
    jobs: List[Obj],
    pods: Callable[[], List[Obj]],
    reason: str,
) -> None:
    """Annotate and suspend the Indexed Jobs of a stalled app, then delete its pods (unless
    it ended since the waiter saw it RUNNING: left as it ended)."""
    from kubernetes.client.rest import ApiException

    if is_terminal(ks.combine_states([ks.batch_job_state(j)[0] for j in jobs])):
        return
    for j in jobs:
        body = {**_annotation(reason), "spec": {"suspend": True}}
        batch.patch_namespaced_job(j["metadata"]["name"], namespace, body)
    for pod in pods():
        try:
            core.delete_namespaced_pod(pod["metadata"]["name"], namespace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise


def abort_volcano(custom: Any, namespace: str, job: Obj, reason: str) -> None:
    """Abort a stalled Volcano job, then annotate it (unless it ended: left as it ended)."""
    if is_terminal(ks.volcano_state(job)):
        return
    _abort_volcano(custom, namespace, job, reason)
    custom.patch_namespaced_custom_object(
        VOLCANO_GROUP,
        VOLCANO_VERSION,
        namespace,
        VOLCANO_PLURAL,
        job["metadata"]["name"],
        _annotation(reason),
    )


def _annotation(reason: str) -> Obj:
    return {"metadata": {"annotations": {ANNOTATION_FAILURE_REASON: reason}}}


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
