"""Stall detection by the waiter on kubernetes, against kmock (the official client over
HTTP to an in-memory API server).

What kmock shows: the scheduler reads each running pod's last log line with
``timestamps=True, tail_lines=1`` through the real client, a stalled app is stopped through
real API calls (a Volcano ``Command`` AbortJob then an annotation patch; a merge patch of
``spec.suspend`` + the annotation on each Indexed Job and pod deletions), the stall
timeout and the reason are stored on the job objects, and a fresh runner reads it FAILED
with the reason. What it cannot show: no controller runs, so the tests play Volcano and
the kubelet (pods, their phases and log lines with stamps written here; kmock ignores
``tail_lines`` and returns the whole log, the scheduler takes the newest stamp), and
nobody acts on the AbortJob command or the suspension (no pods are really killed; the
tests set the phase Volcano would reach). Stamps in the logs stand in for time: no sleeps.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import List, Tuple

import pytest

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import STALL_TIMEOUT
from torchx.schedulers.kubernetes.manifests import (
    ANNOTATION_FAILURE_REASON,
    ANNOTATION_STALL_TIMEOUT,
)
from torchx.schedulers.kubernetes.scheduler import create_scheduler

from .kmock_server import (
    BATCH_JOBS,
    COMMANDS,
    PODS,
    VOLCANO_JOBS,
    KMockServer,
    echo_app,
    indexed_pods,
    volcano_pods,
)

REASON = "stalled: no progress or output for 60 s (no step reported)"


def stamp(t: float) -> str:
    """An RFC 3339 stamp with nanoseconds, as the kubelet prefixes log lines."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def log(*lines: Tuple[float, str]) -> str:
    return "".join(f"{stamp(t)} {text}\n" for t, text in lines)


def running(ago: float) -> dict:
    """A pod status whose container started ``ago`` seconds ago."""
    started = stamp(time.time() - ago)
    return {
        "startTime": started,
        "containerStatuses": [
            {
                "name": "echo",
                "image": "alpine",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
        ],
    }


def volcano_running(
    srv: KMockServer, n: int = 2, stall_timeout: float = 60
) -> Tuple[str, str, List[str]]:
    handle = get_runner(trackers={}).run(
        echo_app(n=n), "kubernetes", {"queue": "q"}, stall_timeout=stall_timeout
    )
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    volcano_pods(srv, app_id, ["Running"] * n, **running(3600))
    return handle, app_id, [f"{name}-echo-{i}-0" for i in range(n)]


def test_a_pod_that_logged_recently_is_not_stopped(srv: KMockServer) -> None:
    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    now = time.time()
    srv.set_log(ns, pods[0], log((now - 3600, "old line")))
    srv.set_log(ns, pods[1], log((now - 4000, "a"), (now - 5, "step 9")))  # the newest wins
    sched = create_scheduler("t")
    assert abs((sched.last_activity(app_id) or 0) - (now - 5)) < 0.01
    assert (
        srv.log_requests[-1]["timestamps"].lower() == "true"
        and srv.log_requests[-1]["tailLines"] == "1"
    )

    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=1)  # a fresh waiter
    assert status is not None and status.state == specs.AppState.RUNNING, status
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and ANNOTATION_FAILURE_REASON not in job["metadata"]["annotations"]
    assert srv.names(COMMANDS, ns) == []


def test_a_stalled_volcano_app_is_aborted_and_reads_failed_with_the_reason(
    srv: KMockServer,
) -> None:
    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    for pod in pods:  # printed an hour ago, stall timeout 60 s
        srv.set_log(ns, pod, log((time.time() - 3600, "last words")))
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and job["metadata"]["annotations"][ANNOTATION_STALL_TIMEOUT] == "60"

    # a fresh runner (another process, like the Airflow trigger) finds the timeout on the job
    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=10)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg == REASON
    command = srv.get(COMMANDS, ns, f"{name}-stalled")
    assert command is not None
    assert (command["action"], command["target"]["name"], command["target"]["kind"]) == (
        "AbortJob",
        name,
        "Job",
    )
    assert command["message"] == REASON
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and job["metadata"]["annotations"][ANNOTATION_FAILURE_REASON] == REASON

    # play Volcano: the aborted job's phase; it is kept, and every later reader sees why
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Aborted"}}})
    fresh = get_runner(trackers={})
    desc = fresh.status(handle)
    assert desc is not None and desc.state == specs.AppState.FAILED and desc.msg == REASON
    app = fresh.describe(handle)
    assert app is not None and app.metadata.get(STALL_TIMEOUT) == "60"
    listed = {a.app_handle: a.state for a in fresh.list("kubernetes")}
    assert listed[handle] == specs.AppState.FAILED
    assert create_scheduler("t").last_activity(app_id) is None  # no longer RUNNING


def test_a_stalled_indexed_app_is_suspended_and_its_pods_deleted(srv: KMockServer) -> None:
    runner = get_runner(trackers={})
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"}, stall_timeout=60)
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    srv.patch(BATCH_JOBS, ns, f"{name}-echo", {"status": {"active": 2, "ready": 2}})
    pods = indexed_pods(srv, ns, f"{name}-echo", ["Running", "Running"], **running(3600))
    srv.set_log(ns, pods[0], log((time.time() - 120, "quiet since")))
    srv.set_log(ns, pods[1], "")  # printed nothing: its start (an hour ago) counts

    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=10)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg == REASON
    job = srv.get(BATCH_JOBS, ns, f"{name}-echo")
    assert job is not None and job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"][ANNOTATION_FAILURE_REASON] == REASON
    assert srv.names(PODS, ns) == []  # the gang is stopped; the Job and Service stay
    fresh = get_runner(trackers={}).status(handle)
    assert fresh is not None and fresh.state == specs.AppState.FAILED and fresh.msg == REASON
    get_runner(trackers={}).cancel(handle)  # a FAILED app's objects: cancel still deletes them
    assert srv.get(BATCH_JOBS, ns, f"{name}-echo") is None


def test_unreadable_logs_or_no_running_pod_give_none(srv: KMockServer) -> None:
    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    sched = create_scheduler("t")
    srv.set_log(ns, pods[0], log((time.time() - 3600, "x")))
    assert sched.last_activity(app_id) is None  # pods[1]'s log: 404 from the API server
    srv.set_log(ns, pods[1], "no stamp on this line\n")
    assert abs((sched.last_activity(app_id) or 0) - (time.time() - 3600)) < 5  # start counts

    srv.logs.clear()  # every log read fails: the waiter never stops it
    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=1)
    assert status is not None and status.state == specs.AppState.RUNNING
    assert srv.names(COMMANDS, ns) == []

    volcano_pods(srv, app_id, ["Pending", "Pending"])  # a gang waiting for nodes
    assert sched.last_activity(app_id) is None
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    assert sched.last_activity(app_id) is None


def test_quiet_ranks_waiting_for_a_pending_peer_are_not_stopped(srv: KMockServer) -> None:
    """A gang reads RUNNING once some replicas run; the running ones wait silently in
    rendezvous for a Pending peer: nothing to judge until every replica runs."""
    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    volcano_pods(srv, app_id, ["Running", "Pending"], **running(3600))
    srv.set_log(ns, pods[0], log((time.time() - 3600, "waiting for peers")))
    sched = create_scheduler("t")
    assert sched.last_activity(app_id) is None
    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=1)
    assert status is not None and status.state == specs.AppState.RUNNING, status
    assert srv.names(COMMANDS, ns) == []

    runner = get_runner(trackers={})
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"}, stall_timeout=60)
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(BATCH_JOBS, ns, f"{name}-echo", {"status": {"active": 2, "ready": 1}})
    pods = indexed_pods(srv, ns, f"{name}-echo", ["Running"], **running(3600))  # index 1: none
    srv.set_log(ns, pods[0], log((time.time() - 3600, "waiting for peers")))
    assert sched.last_activity(app_id) is None
    status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=1)
    assert status is not None and status.state == specs.AppState.RUNNING, status
    job = srv.get(BATCH_JOBS, ns, f"{name}-echo")
    assert job is not None and ANNOTATION_FAILURE_REASON not in job["metadata"]["annotations"]


def test_an_app_that_completed_as_it_was_stopped_reads_succeeded(srv: KMockServer) -> None:
    """The race: the app completes between the waiter's RUNNING and its stop. A stop that
    comes late does nothing, and one that came first does not relabel the success."""
    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Completed"}}})
    sched = create_scheduler("t")
    sched.stop_stalled(app_id, REASON)  # late: the job is already done
    assert srv.names(COMMANDS, ns) == []
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and ANNOTATION_FAILURE_REASON not in job["metadata"]["annotations"]
    # annotated just before Volcano marked it Completed: Completed wins
    srv.patch(
        VOLCANO_JOBS, ns, name, {"metadata": {"annotations": {ANNOTATION_FAILURE_REASON: REASON}}}
    )
    status = get_runner(trackers={}).status(handle)
    assert status is not None and status.state == specs.AppState.SUCCEEDED, status
    assert REASON not in status.msg

    runner = get_runner(trackers={})
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"}, stall_timeout=60)
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    complete = {"type": "Complete", "status": "True"}
    srv.patch(
        BATCH_JOBS, ns, f"{name}-echo", {"status": {"succeeded": 2, "conditions": [complete]}}
    )
    pods = indexed_pods(srv, ns, f"{name}-echo", ["Succeeded", "Succeeded"])
    sched.stop_stalled(app_id, REASON)
    job = srv.get(BATCH_JOBS, ns, f"{name}-echo")
    assert job is not None and not job["spec"].get("suspend")
    assert ANNOTATION_FAILURE_REASON not in job["metadata"]["annotations"]
    assert set(pods) <= set(srv.names(PODS, ns))  # not deleted
    annotate = {"metadata": {"annotations": {ANNOTATION_FAILURE_REASON: REASON}}}
    srv.patch(BATCH_JOBS, ns, f"{name}-echo", annotate)
    status = get_runner(trackers={}).status(handle)
    assert status is not None and status.state == specs.AppState.SUCCEEDED, status


@pytest.mark.parametrize("hook", ["last_activity", "describe", "progress", "stop_stalled"])
def test_a_failing_stall_hook_leaves_the_app_running_and_wait_waiting(
    srv: KMockServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hook: str,
) -> None:
    """The API (or the tracker) failing while a waiter checks a stalled-looking app: never
    on doubt, the waiter keeps waiting (an Airflow trigger would otherwise fail the task of
    a healthy job) and the app runs on."""
    from torchx.runner.api import Runner
    from torchx.schedulers.kubernetes.api import KubernetesError
    from torchx.schedulers.kubernetes.scheduler import KubernetesScheduler

    handle, app_id, pods = volcano_running(srv)
    ns, name = app_id.split(":")
    for pod in pods:
        srv.set_log(ns, pod, log((time.time() - 3600, "last words")))

    def fail(*args: object, **kwargs: object) -> None:
        raise KubernetesError(f"{hook}: the API server is unreachable")

    owner = Runner if hook in ("describe", "progress") else KubernetesScheduler
    monkeypatch.setattr(owner, hook, fail)
    with caplog.at_level(logging.WARNING, logger="torchx.runner.stall"):
        status = get_runner(trackers={}).wait(handle, wait_interval=0.1, timeout=1)
    assert status is not None and status.state == specs.AppState.RUNNING, status
    assert any("unreachable" in r.getMessage() for r in caplog.records), caplog.records
    assert srv.names(COMMANDS, ns) == []
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and ANNOTATION_FAILURE_REASON not in job["metadata"]["annotations"]
