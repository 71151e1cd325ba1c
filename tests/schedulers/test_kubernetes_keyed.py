"""Keyed submission on Kubernetes (kmock): a claim ConfigMap named after the key's token
and generation is created before the app's objects, and the API server's 409 for a taken
name decides a race. Cancel keeps the claim, so an old handle never names a new app and the
key's next lookup counts the cancelled app."""

from __future__ import annotations

import re
import threading
import time
from typing import Any, List

import pytest

from tests.racing import race_runs
from torchx import specs
from torchx.runner import Runner, get_runner
from torchx.schedulers.api import (
    IDEMPOTENCY_GENERATION,
    IDEMPOTENCY_TOKEN,
    GenerationTaken,
    idempotency_token,
)
from torchx.schedulers.kubernetes.api import KubernetesError
from torchx.schedulers.kubernetes.claims import CREATE_GRACE_S
from torchx.schedulers.kubernetes.manifests import ANNOTATION_SUBMITTED_AT
from torchx.schedulers.kubernetes.scheduler import KubernetesScheduler, create_scheduler
from torchx.specs import AppState

from .kmock_server import BATCH_JOBS, CONFIG_MAPS, VOLCANO_JOBS, KMockServer, echo_app

NS = "default"
CFGS = {"volcano": {"queue": "q"}, "indexed": {"job_type": "indexed"}}


def _creates(srv: KMockServer, kind: str, since: int) -> int:
    """How many create requests (POST) for ``kind`` ("jobs", "configmaps") the server got
    after mark ``since`` (``request_count``), refused ones included."""

    def read() -> int:
        return sum(
            1
            for r in list(srv.km)[since:]
            if str(r.method.value).upper() == "POST" and r.url.path.endswith(f"/{kind}")
        )

    return srv.call(read)


def _keyed(token: str, generation: str) -> specs.AppDef:
    app = echo_app()
    app.metadata.update({IDEMPOTENCY_TOKEN: token, IDEMPOTENCY_GENERATION: generation})
    return app


def _name(handle: str) -> str:
    return specs.parse_app_handle(handle).app_id.split(":")[1]


@pytest.mark.parametrize("job_type", ["volcano", "indexed"])
def test_racing_keyed_submitters_create_one_job(
    srv: KMockServer, monkeypatch: pytest.MonkeyPatch, job_type: str
) -> None:
    """All racers look the key up (nothing yet), then all submit: one creates its job, the
    others' claims are refused and they re-attach to it, launching nothing."""
    mark, n = srv.request_count(), 6
    barrier = threading.Barrier(n)
    looked_up = threading.local()
    find = KubernetesScheduler.find_by_idempotency_token

    def find_then_race(self: KubernetesScheduler, *args: Any) -> Any:
        found = find(self, *args)
        if not getattr(looked_up, "done", False):  # every racer's first lookup saw nothing
            looked_up.done = True
            barrier.wait(timeout=120)
        return found

    monkeypatch.setattr(KubernetesScheduler, "find_by_idempotency_token", find_then_race)

    def submit(runner: Runner) -> str:
        return runner.run(echo_app(), "kubernetes", CFGS[job_type], idempotency_key="race")

    handles, reattached = race_runs(n, submit)
    assert len(handles) == n and len(set(handles)) == 1, handles
    assert reattached.count(False) == 1, reattached
    assert _creates(srv, "jobs", mark) == 1  # the winner's job; no loser created one
    assert _creates(srv, "configmaps", mark) == n  # one claim each, n - 1 refused
    assert srv.names(CONFIG_MAPS, NS) == [_name(handles[0])]
    jobs = srv.names(VOLCANO_JOBS if job_type == "volcano" else BATCH_JOBS, NS)
    assert len(jobs) == 1 and jobs[0].startswith(_name(handles[0]))
    assert handles[0].endswith(f"-{idempotency_token('race')[-12:]}-0"), handles


def test_a_retry_after_cancel_or_failure_is_the_next_generation_and_old_handles_stay_put(
    srv: KMockServer,
) -> None:
    key = "dag/train/retry"
    cfg = CFGS["volcano"]
    with get_runner() as runner:
        first = runner.run(echo_app(), "kubernetes", cfg, idempotency_key=key)
        runner.cancel(first)
        assert srv.names(VOLCANO_JOBS, NS) == []  # its job is deleted, its claim stays
        second = runner.run(echo_app(), "kubernetes", cfg, idempotency_key=key)
        srv.patch(VOLCANO_JOBS, NS, _name(second), {"status": {"state": {"phase": "Failed"}}})
        third = runner.run(echo_app(), "kubernetes", cfg, idempotency_key=key)
        assert not runner.reattached(second) and not runner.reattached(third)
    token = idempotency_token(key)[-12:]
    assert [h.rsplit("-", 2)[1:] for h in (first, second, third)] == [
        [token, "0"],
        [token, "1"],
        [token, "2"],
    ]
    with get_runner() as other:  # another process holding the old handle (a trigger, reaper)
        status = other.status(first)
        assert status is not None and status.state == AppState.CANCELLED
        other.cancel(first)  # names the cancelled app only
        status = other.status(third)
        assert status is not None and status.state == AppState.SUBMITTED
    assert srv.names(VOLCANO_JOBS, NS) == [_name(second), _name(third)]
    found = create_scheduler("test").find_by_idempotency_token(idempotency_token(key))
    assert [(a.app_id.split(":")[1], a.state) for a in found] == [
        (_name(first), AppState.CANCELLED),
        (_name(second), AppState.FAILED),
        (_name(third), AppState.SUBMITTED),
    ]


def test_a_stale_submitter_gets_generation_taken_and_the_runner_takes_the_next(
    srv: KMockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, mark = "dag/train/stale", srv.request_count()
    token = idempotency_token(key)
    with get_runner() as runner:
        first = runner.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
        runner.cancel(first)
    sched = create_scheduler("test")
    info = sched.submit_dryrun(_keyed(token, "0"), CFGS["volcano"])
    assert "kind: ConfigMap" in str(info)  # the dry run shows the claim
    with pytest.raises(GenerationTaken) as taken:
        sched.schedule_keyed(token, info, False)
    assert taken.value.generation == 1
    assert _creates(srv, "jobs", mark) == 1  # the stale submission created nothing

    # the Runner given that stale view (nothing found) submits again as generation 1
    monkeypatch.setattr(KubernetesScheduler, "find_by_idempotency_token", _stale_once())
    with get_runner() as runner:
        second = runner.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
    assert second.endswith(f"{token[-12:]}-1") and not second.endswith(first[-2:]), second


def _stale_once() -> Any:
    find = KubernetesScheduler.find_by_idempotency_token
    calls: List[int] = []

    def stale(self: KubernetesScheduler, *args: Any) -> Any:
        calls.append(1)
        return [] if len(calls) == 1 else find(self, *args)

    return stale


def test_a_claim_without_its_job_is_live_for_a_while_then_failed(srv: KMockServer) -> None:
    """A submitter died between its claim and its job. Until ``CREATE_GRACE_S`` has passed
    the claim is taken for a job on its way (a racer re-attaches to it); after that it is
    FAILED, so the key is not held for good: the next run is generation 1."""
    key = "dag/train/died"
    token = idempotency_token(key)
    sched = create_scheduler("test")
    claim = sched.submit_dryrun(_keyed(token, "0"), CFGS["volcano"]).request.claim
    assert claim is not None
    name = claim["metadata"]["name"]
    srv.put(CONFIG_MAPS, NS, name, claim)
    with get_runner() as runner:
        attached = runner.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
        assert runner.reattached(attached) and _name(attached) == name
    long_ago = str(int((time.time() - 2 * CREATE_GRACE_S) * 1e9))
    srv.patch(
        CONFIG_MAPS, NS, name, {"metadata": {"annotations": {ANNOTATION_SUBMITTED_AT: long_ago}}}
    )
    with get_runner() as runner:
        status = runner.status(attached)
        assert status is not None and status.state == AppState.FAILED
        assert "never created" in status.msg
        retried = runner.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
    assert retried.endswith(f"{token[-12:]}-1") and not runner.reattached(retried)
    assert srv.names(VOLCANO_JOBS, NS) == [_name(retried)]


def test_a_cancel_between_a_claim_and_its_job_ends_the_job(
    srv: KMockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A racer re-attaches to the winner's claim before the winner's job exists and cancels
    it there: the winner, creating its job after that, cancels it at once."""
    from kubernetes.client import CoreV1Api

    key = "dag/train/gap"
    create_claim = CoreV1Api.create_namespaced_config_map
    cancelled: List[str] = []

    def claim_then_a_racer_cancels(self: CoreV1Api, *args: Any, **kwargs: Any) -> Any:
        created = create_claim(self, *args, **kwargs)
        monkeypatch.setattr(CoreV1Api, "create_namespaced_config_map", create_claim)
        with get_runner() as racer:
            handle = racer.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
            assert racer.reattached(handle)
            racer.cancel(handle)
        cancelled.append(handle)
        return created

    monkeypatch.setattr(CoreV1Api, "create_namespaced_config_map", claim_then_a_racer_cancels)
    with get_runner() as runner:
        winner = runner.run(echo_app(), "kubernetes", CFGS["volcano"], idempotency_key=key)
        status = runner.status(winner)
    assert cancelled == [winner]
    assert status is not None and status.state == AppState.CANCELLED
    assert srv.names(VOLCANO_JOBS, NS) == []


def test_unkeyed_submits_no_claim_and_a_keyed_claim_is_in_its_namespace(srv: KMockServer) -> None:
    mark = srv.request_count()
    with get_runner() as runner:
        plain = runner.run(echo_app(), "kubernetes", CFGS["volcano"])
        runner.cancel(plain)
        keyed = runner.run(
            echo_app(),
            "kubernetes",
            {**CFGS["indexed"], "namespace": "team-b"},
            idempotency_key="k",
        )
        again = runner.run(
            echo_app(),
            "kubernetes",
            {**CFGS["indexed"], "namespace": "team-b"},
            idempotency_key="k",
        )
    assert srv.names(CONFIG_MAPS, NS) == [] and _creates(srv, "configmaps", mark) == 1
    assert again == keyed and srv.names(CONFIG_MAPS, "team-b") == [_name(keyed)]
    assert specs.parse_app_handle(keyed).app_id.startswith("team-b:")


def test_without_rights_on_config_maps_only_keyed_submission_fails(srv: KMockServer) -> None:
    """An account that may not touch ConfigMaps runs, reads and cancels unkeyed apps as
    before; a keyed submission fails in one line naming the refusal."""
    locked = re.compile(r"/api/v1/namespaces/locked/configmaps.*")
    for method in ("get", "post", "patch", "delete"):
        srv.call(lambda method=method: srv.km[method, locked] << 403)
    cfg = {**CFGS["volcano"], "namespace": "locked"}
    with get_runner() as runner:
        plain = runner.run(echo_app(), "kubernetes", cfg)
        runner.cancel(plain)
    with get_runner() as other:
        assert other.status(plain) is None  # deleted: unknown, as before claims
        with pytest.raises(KubernetesError, match="403"):
            other.run(echo_app(), "kubernetes", cfg, idempotency_key="k")
    assert srv.names(VOLCANO_JOBS, "locked") == []
