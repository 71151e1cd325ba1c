"""Stall detection on kubernetes, against kmock (the official client over HTTP to an
in-memory API server).

What kmock shows: with a stall timeout, the rank-0 replica's container runs its command under
``torchx.runtime.watchdog`` with ``terminationMessagePolicy: FallbackToLogsOnError`` (the
manifests the real client sends), the timeout is stored on the job objects, and a fresh
runner reads an app whose container ended with the watchdog's last line as its
termination message FAILED with that reason, for Volcano and Indexed Jobs alike. What it
cannot show: no kubelet or controller runs here, so the tests play them (the pods, their
phases and the termination message the kubelet would take from the log's tail); the
watchdog itself is tested on real processes in ``tests/runtime/test_watchdog.py``.
"""

from __future__ import annotations

from typing import Any, Dict

from torchx import specs
from torchx.runner import get_runner
from torchx.runtime.watchdog import MARK, STALLED_EXIT
from torchx.schedulers.api import STALL_TIMEOUT
from torchx.schedulers.kubernetes.manifests import ANNOTATION_STALL_TIMEOUT

from .kmock_server import (
    BATCH_JOBS,
    VOLCANO_JOBS,
    KMockServer,
    echo_app,
    indexed_pods,
    volcano_pods,
)

REASON = "stalled: no progress or output for 60 s (no step reported)"
WATCHDOG = ["python", "-m", "torchx.runtime.watchdog", "60", "--"]


def ended(code: int, message: str) -> Dict[str, Any]:
    """A pod status whose container ended with ``code`` and termination ``message``."""
    terminated = {"exitCode": code, "reason": "Error", "message": message}
    return {"containerStatuses": [{"name": "echo", "state": {"terminated": terminated}}]}


def test_a_watched_app_runs_its_rank0_replica_under_the_watchdog(srv: KMockServer) -> None:
    runner = get_runner(trackers={})
    for cfg in ({"queue": "q"}, {"job_type": "indexed"}):
        handle = runner.run(echo_app(n=2), "kubernetes", cfg, stall_timeout=60)
        ns, name = specs.parse_app_handle(handle).app_id.split(":")
        if cfg.get("queue"):
            job = srv.get(VOLCANO_JOBS, ns, name)
            assert job is not None
            templates = [t["template"] for t in job["spec"]["tasks"]]
        else:
            job = srv.get(BATCH_JOBS, ns, f"{name}-echo")
            assert job is not None
            templates = [job["spec"]["template"]]
        assert job["metadata"]["annotations"][ANNOTATION_STALL_TIMEOUT] == "60"
        # pods share no directory: the rank-0 pod is judged, the others run as they are
        # (a DDP rank that prints nothing while rank 0 prints is not stalled)
        rank0, *others = [tmpl["spec"]["containers"][0] for tmpl in templates]
        if cfg.get("queue"):
            assert rank0["command"][: len(WATCHDOG) + 1] == [*WATCHDOG, "echo"]
            assert [c["command"][0] for c in others] == ["echo"]
        else:  # one template for every index: the watchdog judges index 0 only
            only = ["--only-where", "TORCHX_REPLICA_ID=0", "--"]
            assert rank0["command"][: len(WATCHDOG) + 3] == [*WATCHDOG[:-1], *only, "echo"]
        assert rank0["terminationMessagePolicy"] == "FallbackToLogsOnError"
    handle = runner.run(echo_app(n=1), "kubernetes", {"queue": "q"})  # no timeout: as is
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
    assert container["command"][0] == "echo" and "terminationMessagePolicy" not in container


def test_a_stalled_volcano_app_reads_failed_with_the_reason_for_every_reader(
    srv: KMockServer,
) -> None:
    handle = get_runner(trackers={}).run(
        echo_app(n=2), "kubernetes", {"queue": "q"}, stall_timeout=60
    )
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    # play the kubelet and Volcano: replica 0's watchdog ended it, the gang failed
    message = f"step 3\n{MARK}{REASON}\n"
    volcano_pods(srv, app_id, ["Failed"], **ended(STALLED_EXIT, message))
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})

    fresh = get_runner(trackers={})
    status = fresh.wait(handle, wait_interval=0.1, timeout=10)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg == REASON
    app = fresh.describe(handle)
    assert app is not None and app.metadata.get(STALL_TIMEOUT) == "60"


def test_a_stalled_indexed_app_reads_failed_with_the_reason(srv: KMockServer) -> None:
    handle = get_runner(trackers={}).run(
        echo_app(n=2), "kubernetes", {"job_type": "indexed"}, stall_timeout=60
    )
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    srv.patch(BATCH_JOBS, ns, f"{name}-echo", {"status": {"failed": 1, "conditions": [failed]}})
    indexed_pods(srv, ns, f"{name}-echo", ["Failed"], **ended(STALLED_EXIT, f"{MARK}{REASON}"))

    status = get_runner(trackers={}).status(handle)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg == REASON


def test_an_ordinary_failure_keeps_its_own_message(srv: KMockServer) -> None:
    handle = get_runner(trackers={}).run(
        echo_app(n=1), "kubernetes", {"queue": "q"}, stall_timeout=60
    )
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    volcano_pods(srv, app_id, ["Failed"], **ended(1, "ValueError: bad input"))
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})
    status = get_runner(trackers={}).status(handle)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert "ValueError: bad input" in status.msg and "stalled" not in status.msg
