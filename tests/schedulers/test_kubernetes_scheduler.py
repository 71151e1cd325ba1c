"""kubernetes scheduler against kmock, an in-memory Kubernetes API server the official
client talks HTTP to. There are no controllers: tests play Volcano / the Job controller /
the kubelet by writing job status, pods and pod logs into the emulator."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, List

import pytest

from torchx import specs
from torchx.pipelines.prefect import stages
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, InvalidAppError, idempotency_token
from torchx.schedulers.kubernetes.api import KubernetesError
from torchx.schedulers.kubernetes.manifests import ANNOTATION_SUBMITTED_AT, LABEL_IDEMPOTENCY_TOKEN
from torchx.schedulers.kubernetes.scheduler import create_scheduler

from .kmock_server import (
    BATCH_JOBS,
    CONFIG_MAPS,
    PODS,
    SERVICES,
    VOLCANO_JOBS,
    KMockServer,
    app_status,
    container,
    ddp_app,
    echo_app,
    indexed_pods,
    replica_states,
    volcano_pods,
)

NS = "default"


# --------------------------------------------------------------------------- lifecycle in kmock


def test_volcano_submit_status_list_through_runner(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(ddp_app(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    assert ns == NS
    stored = srv.get(VOLCANO_JOBS, ns, name)
    assert stored is not None and stored["spec"]["tasks"][1]["minAvailable"] == 0

    assert (
        app_status(runner, handle).state == specs.AppState.SUBMITTED
    )  # no controller has seen it yet
    srv.patch(
        VOLCANO_JOBS,
        ns,
        name,
        {
            "status": {
                "state": {"phase": "Pending"},
                "taskStatusCount": {"train-0": {"phase": {"Pending": 1}}},
            }
        },
    )
    status = app_status(runner, handle)
    assert status.state == specs.AppState.PENDING
    assert replica_states(status) == {"train": [specs.AppState.PENDING, specs.AppState.PENDING]}

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    volcano_pods(srv, app_id, ["Running", "Pending"])
    status = app_status(runner, handle)
    assert status.state == specs.AppState.RUNNING
    assert replica_states(status) == {"train": [specs.AppState.RUNNING, specs.AppState.PENDING]}
    assert status.roles[0].replicas[0].hostname == "node-1"

    srv.patch(
        VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Restarting"}, "retryCount": 1}}
    )
    assert app_status(runner, handle).num_restarts == 1

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Completed"}}})
    volcano_pods(srv, app_id, ["Succeeded", "Succeeded"])
    done = runner.wait(handle, wait_interval=0.1, timeout=10)
    assert done is not None and done.state == specs.AppState.SUCCEEDED
    assert replica_states(done) == {"train": [specs.AppState.SUCCEEDED] * 2}

    # another process (a fresh runner) sees the app and its roles from the cluster alone
    other = get_runner()
    app = other.describe(handle)
    assert app is not None and [(r.name, r.num_replicas, r.min_replicas) for r in app.roles] == [
        ("train", 2, 1)
    ]
    assert app.roles[0].resource.memMB == 4096 and app.roles[0].resource.gpu == 2
    listed = {a.app_handle: a for a in other.list("kubernetes")}
    assert listed[handle].state == specs.AppState.SUCCEEDED and listed[handle].name == "trainer"


def test_volcano_phase_mapping(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(), "kubernetes", {"queue": "q"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    expected = {
        "Aborting": specs.AppState.RUNNING,
        "Terminating": specs.AppState.RUNNING,
        "Failed": specs.AppState.FAILED,
        "Terminated": specs.AppState.FAILED,
        "Aborted": specs.AppState.CANCELLED,
    }
    for phase, state in expected.items():
        srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": phase}}})
        assert app_status(runner, handle).state == state, phase


def test_describe_reads_limits_with_the_one_quantity_parser(srv: KMockServer) -> None:
    """A job edited with kubectl to decimal units reads back as Kubernetes means them."""
    sched = create_scheduler("test")
    app_id = sched.submit(echo_app(), {"queue": "q"})
    ns, name = app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    container(job["spec"]["tasks"][0]["template"])["resources"]["limits"] = {
        "cpu": "2500m",
        "memory": "8e9",  # 8G in exponent form
    }
    srv.put(VOLCANO_JOBS, ns, name, job)
    desc = sched.describe(app_id)
    assert desc is not None
    resource = desc.roles[0].resource
    assert (resource.cpu, resource.memMB) == (3, 7629)  # cpu rounded up, never down


def test_cancel_deletes_the_job(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(ddp_app(), "kubernetes", {"queue": "default"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    runner.cancel(handle)
    assert srv.get(VOLCANO_JOBS, ns, name) is None
    assert app_status(runner, handle).state == specs.AppState.CANCELLED  # this process deleted it
    assert get_runner().status(handle) is None  # elsewhere: gone from the cluster
    runner.cancel(handle)  # idempotent


def test_bad_image_fails_instead_of_pending_forever(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(ddp_app(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    waiting = {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "ghcr.io/nope:1"',
        }
    }
    volcano_pods(
        srv, app_id, ["Pending", "Pending"], containerStatuses=[{"name": "c", "state": waiting}]
    )
    status = app_status(runner, handle)
    assert status.state == specs.AppState.FAILED
    assert 'train[0]: ImagePullBackOff: Back-off pulling image "ghcr.io/nope:1"' in status.msg
    assert "ImagePullBackOff" in status.error_summary()
    assert replica_states(status) == {"train": [specs.AppState.FAILED] * 2}


def test_unschedulable_and_oom_reasons_are_surfaced(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(n=1), "kubernetes", {"queue": "q"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    volcano_pods(srv, app_id, ["Pending"], conditions=[cond])
    status = app_status(runner, handle)
    assert status.state == specs.AppState.PENDING  # the cluster may still scale up
    assert (
        status.msg
        == "echo[0]: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    volcano_pods(srv, app_id, ["Failed"], containerStatuses=[{"name": "c", "state": oom}])
    status = app_status(runner, handle)
    assert status.state == specs.AppState.FAILED
    assert "OOMKilled" in status.roles[0].replicas[0].structured_error_msg
    assert "OOMKilled" in status.error_summary()


def test_indexed_lifecycle_through_runner(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(ddp_app(), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    job_name = f"{name}-train"
    assert srv.get(SERVICES, ns, name) is not None and srv.get(BATCH_JOBS, ns, job_name) is not None
    assert srv.names(VOLCANO_JOBS) == []
    assert app_status(runner, handle).state == specs.AppState.SUBMITTED

    srv.patch(BATCH_JOBS, ns, job_name, {"status": {"active": 2, "ready": 1}})
    indexed_pods(srv, ns, job_name, ["Running", "Pending"])
    status = app_status(runner, handle)
    assert status.state == specs.AppState.RUNNING
    assert replica_states(status) == {"train": [specs.AppState.RUNNING, specs.AppState.PENDING]}
    assert [r.hostname for r in status.roles[0].replicas] == ["node-0", "node-1"]

    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
    }
    srv.patch(
        BATCH_JOBS, ns, job_name, {"status": {"failed": 3, "active": 0, "conditions": [failed]}}
    )
    indexed_pods(srv, ns, job_name, ["Failed", "Running"])
    status = app_status(runner, handle)
    assert status.state == specs.AppState.FAILED and status.num_restarts == 3
    assert status.msg == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    listed = {a.app_handle: a.state for a in get_runner().list("kubernetes")}
    assert listed[handle] == specs.AppState.FAILED
    app = get_runner().describe(handle)
    assert app is not None and [(r.name, r.num_replicas) for r in app.roles] == [("train", 2)]


def test_indexed_cancel_deletes_jobs_and_service(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(n=2), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    runner.cancel(handle)
    assert srv.get(BATCH_JOBS, ns, f"{name}-echo") is None and srv.get(SERVICES, ns, name) is None
    assert app_status(runner, handle).state == specs.AppState.CANCELLED


def test_list_only_shows_torchx_apps(srv: KMockServer) -> None:
    srv.put(
        VOLCANO_JOBS,
        NS,
        "someone-else",
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {}},
    )
    srv.put(BATCH_JOBS, NS, "cron-job", {"apiVersion": "batch/v1", "kind": "Job", "spec": {}})
    runner = get_runner()
    h1 = runner.run(echo_app(), "kubernetes", {"queue": "q"})
    h2 = runner.run(echo_app(), "kubernetes", {"job_type": "indexed"})
    assert sorted(a.app_handle for a in runner.list("kubernetes")) == sorted([h1, h2])


# --------------------------------------------------------------------------- idempotency


def _keyed(token: str, n: int = 1) -> specs.AppDef:
    app = echo_app(n=n)
    app.metadata[IDEMPOTENCY_TOKEN] = token
    return app


def _stamp(srv: KMockServer, resource: str, app_id: str, created: str, job: str = "") -> None:
    """Play the API server: set an object's creationTimestamp."""
    ns, name = app_id.split(":")
    srv.patch(resource, ns, job or name, {"metadata": {"creationTimestamp": created}})


def test_token_is_a_label_and_found_oldest_first(srv: KMockServer) -> None:
    sched = create_scheduler("test")
    t1, t2 = idempotency_token("dag/task/run-1"), idempotency_token("dag/task/run-2")
    first = sched.submit(_keyed(t1), {"queue": "q"})
    second = sched.submit(_keyed(t1, n=2), {"job_type": "indexed"})  # one app, several objects
    other = sched.submit(_keyed(t2), {"queue": "q"})
    plain = sched.submit(echo_app(), {"queue": "q"})
    ns, name = first.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None and job["metadata"]["labels"][LABEL_IDEMPOTENCY_TOKEN] == t1
    _, second_name = second.split(":")
    indexed = srv.get(BATCH_JOBS, ns, f"{second_name}-echo")
    assert indexed is not None and indexed["metadata"]["labels"][LABEL_IDEMPOTENCY_TOKEN] == t1
    _stamp(srv, VOLCANO_JOBS, first, "2025-01-01T00:00:01Z")
    _stamp(srv, BATCH_JOBS, second, "2025-01-01T00:00:02Z", job=f"{second_name}-echo")

    mark = srv.request_count()
    found = sched.find_by_idempotency_token(t1)
    assert [(a.app_id, a.state, a.name) for a in found] == [
        (first, specs.AppState.SUBMITTED, "echo"),
        (second, specs.AppState.SUBMITTED, "echo"),
    ]
    selector = f"app.kubernetes.io/managed-by=torchx.pytorch.org,{LABEL_IDEMPOTENCY_TOKEN}={t1}"
    lists = srv.list_selectors(since=mark)
    kinds = sorted(path.rsplit("/", 1)[-1] for path, _ in lists)  # Volcano, batch, claims
    assert kinds == ["configmaps", "jobs", "jobs"]
    assert all(sel == selector for _, sel in lists)  # the API server filters
    assert [a.app_id for a in sched.find_by_idempotency_token(t2)] == [other]
    assert sched.find_by_idempotency_token(idempotency_token("never used")) == []
    assert {a.app_id for a in sched.list()} == {first, second, other, plain}

    # The backend's creation time decides, not the order this process submitted in.
    _stamp(srv, VOLCANO_JOBS, first, "2025-01-01T00:00:03Z")
    assert [a.app_id for a in sched.find_by_idempotency_token(t1)] == [second, first]


def test_a_keyed_app_in_another_namespace_is_found_by_its_retry(srv: KMockServer) -> None:
    """A keyed run submitted with ``-cfg namespace=team-b`` is found by its retry (with
    the same cfg), whose scheduler's namespace is the kube context's (``default``): one
    app, not two. The lookup stays in the run's namespace: the same key in another
    namespace (another team's DAG of the same name) is not re-attached to."""
    cfg = {"queue": "q", "namespace": "team-b"}
    key = "dag/train/ns"
    with get_runner() as runner:
        first = runner.run(echo_app(), "kubernetes", cfg, idempotency_key=key)
    with get_runner() as retry:  # another worker's retry
        assert retry.find_by_idempotency_key("kubernetes", key, cfg=cfg) == first
        again = retry.run(echo_app(), "kubernetes", cfg, idempotency_key=key)
        assert retry.find_by_idempotency_key("kubernetes", key) is None  # not in default
        other_team = retry.run(echo_app(), "kubernetes", {"queue": "q"}, idempotency_key=key)
    ns, name = specs.parse_app_handle(first).app_id.split(":")
    assert again == first and ns == "team-b"
    assert srv.names(VOLCANO_JOBS, "team-b") == [name]
    assert [f"{NS}:{n}" for n in srv.names(VOLCANO_JOBS, NS)] == [
        specs.parse_app_handle(other_team).app_id
    ]
    # a cancelled Prefect flow run's hook reaches the stage's app with its recorded cfg
    record = stages.here("kubernetes", key, {}, cfg)
    stages.cancel_stages([record], "", logging.getLogger("hook"), {})
    assert srv.names(VOLCANO_JOBS, "team-b") == [] and len(srv.names(VOLCANO_JOBS, NS)) == 1


def test_equal_creation_times_order_by_submit_time_then_app_id(srv: KMockServer) -> None:
    sched = create_scheduler("test")
    token = idempotency_token("same-second")
    ids = [sched.submit(_keyed(token), {"queue": "q"}) for _ in range(3)]
    for app_id in ids:
        _stamp(srv, VOLCANO_JOBS, app_id, "2025-01-01T00:00:00Z")
    assert [a.app_id for a in sched.find_by_idempotency_token(token)] == ids
    ns = ids[0].split(":")[0]
    for app_id in ids:  # without the submit-time annotation (e.g. made by kubectl): by app id
        srv.patch(
            VOLCANO_JOBS,
            ns,
            app_id.split(":")[1],
            {"metadata": {"annotations": {ANNOTATION_SUBMITTED_AT: "x"}}},
        )
    assert [a.app_id for a in sched.find_by_idempotency_token(token)] == sorted(ids)


def test_cancelled_or_foreign_jobs_with_the_label_are_not_found(srv: KMockServer) -> None:
    sched = create_scheduler("test")
    token = idempotency_token("k")
    app_id = sched.submit(_keyed(token), {"queue": "q"})
    srv.put(  # someone else's job that copies the label but is not managed by torchx
        VOLCANO_JOBS,
        NS,
        "foreign",
        {"metadata": {"labels": {LABEL_IDEMPOTENCY_TOKEN: token}}, "spec": {}},
    )
    assert [a.app_id for a in sched.find_by_idempotency_token(token)] == [app_id]
    sched.cancel(app_id)
    assert sched.find_by_idempotency_token(token) == []


def test_a_tracked_submit_that_loses_the_race_launches_nothing_and_names_the_winner(
    srv: KMockServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another submitter claims the key between our lookup and our submit: our claim is
    refused (409), we create no job, and our tracker run ends KILLED naming the winner, not
    FAILED or silently."""
    from mlflow import MlflowClient

    from torchx.runner.tracker_session import REATTACHED_TO_TAG

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    key = "dag/train/race"
    winner: List[str] = []
    with get_runner(trackers={"mlflow": store}) as runner:
        sched = runner._scheduler("kubernetes")
        ours_schedule = sched.schedule

        def racing_schedule(dryrun_info: Any) -> str:
            with get_runner() as other:  # the other submitter, as another process
                winner.append(
                    other.run(echo_app(), "kubernetes", {"queue": "q"}, idempotency_key=key)
                )
            return ours_schedule(dryrun_info)

        monkeypatch.setattr(sched, "schedule", racing_schedule)
        handle = runner.run(echo_app(), "kubernetes", {"queue": "q"}, idempotency_key=key)
    assert handle == winner[0]
    assert srv.names(VOLCANO_JOBS, NS) == [specs.parse_app_handle(handle).app_id.split(":")[1]]
    client = MlflowClient(store)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps)
    assert [(r.info.status, r.data.tags.get(REATTACHED_TO_TAG)) for r in runs] == [
        ("KILLED", handle)
    ], runs


def test_a_loser_whose_submitter_died_is_cancelled_by_the_next_caller(
    srv: KMockServer, tmp_path: Path
) -> None:
    """Two tracked submitters raced and the second died after its launch, before it
    converged: its app runs on as a duplicate. The next caller with the key gets the oldest
    app and cancels the other, whose run ends KILLED; the winner's run goes on."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    token = idempotency_token("dag/train/died")
    with get_runner(trackers={"mlflow": store}) as died:  # launches, never converges
        first, second = (
            died.schedule(died.dryrun(_keyed(token), "kubernetes", {"queue": "q"}))
            for _ in range(2)
        )
    ids = [specs.parse_app_handle(h).app_id for h in (first, second)]
    _stamp(srv, VOLCANO_JOBS, ids[0], "2025-01-01T00:00:01Z")
    _stamp(srv, VOLCANO_JOBS, ids[1], "2025-01-01T00:00:02Z")
    with get_runner(trackers={"mlflow": store}) as runner:
        handle = runner.run(
            echo_app(), "kubernetes", {"queue": "q"}, idempotency_key="dag/train/died"
        )
    assert handle == first
    found = create_scheduler("test").find_by_idempotency_token(token)
    assert [a.app_id for a in found] == ids[:1]
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    status = {r.data.tags.get("torchx.job_id"): r.info.status for r in runs}
    assert status == {first: "RUNNING", second: "KILLED"}, status


def test_a_token_that_is_not_a_label_value_is_refused(srv: KMockServer) -> None:
    with pytest.raises(InvalidAppError, match="not a valid Kubernetes label value"):
        get_runner().dryrun(_keyed("has spaces/and slashes"), "kubernetes", {"queue": "q"})


def test_unknown_app_and_bad_app_id(srv: KMockServer) -> None:
    runner = get_runner()
    assert runner.status("kubernetes://torchx/default:nope-12345678") is None
    with pytest.raises(specs.InvalidArgumentError, match="expected NAMESPACE:NAME"):
        runner.status("kubernetes://torchx/nocolon")


def test_conflict_and_missing_volcano_are_clear_errors(srv: KMockServer) -> None:
    runner = get_runner()
    info = runner.dryrun(echo_app(), "kubernetes", {"queue": "q"})
    runner.schedule(info)
    with pytest.raises(KubernetesError, match=f"a job named {info.request.name} already exists"):
        runner.schedule(info)
    srv.call(
        lambda: (
            srv.km["post", re.compile(r"/apis/batch.volcano.sh/v1alpha1/namespaces/novolcano/jobs")]
            << 404
        )
    )
    with pytest.raises(KubernetesError, match="install Volcano or use -cfg job_type=indexed"):
        runner.run(echo_app(), "kubernetes", {"queue": "q", "namespace": "novolcano"})


def test_no_kubeconfig_or_no_server_is_one_line(
    srv: KMockServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # a dry run needs no cluster
    info = get_runner().dryrun(echo_app(), "kubernetes", {"queue": "q"})
    assert info.request.namespace == "default"
    with pytest.raises(KubernetesError, match="no Kubernetes configuration found"):
        get_runner().schedule(info)
    dead = KMockServer.__new__(KMockServer)
    dead.url = "http://127.0.0.1:1"
    monkeypatch.setenv("KUBECONFIG", str(dead.write_kubeconfig(tmp_path / "dead")))
    with pytest.raises(KubernetesError, match="cannot reach the Kubernetes API server"):
        get_runner().status("kubernetes://torchx/default:x")
    with pytest.raises(KubernetesError, match="cannot reach the Kubernetes API server"):
        list(create_scheduler("s").log_iter("default:x", "echo"))  # while the lines are read


def test_scheduler_accepts_an_injected_client(srv: KMockServer) -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = srv.url
    api = client.ApiClient(cfg)
    sched = create_scheduler("s", client=api, namespace="team-a")
    app_id = sched.submit(echo_app(), {"queue": "q"})
    assert app_id.startswith("team-a:")
    assert [a.app_id for a in sched.list()] == [app_id]
    sched.close()  # not ours: the caller's client stays open
    assert client.CoreV1Api(api).list_namespaced_pod("team-a").items == []


# --------------------------------------------------------------------------- secrets

SECRETS = "v1/secrets"
HF_TOKEN = "hf_planted_token_0001"
MLFLOW_PASSWORD = "mlflow_planted_password_0002"
URI_PASSWORD = "uri_planted_password_0003"


@pytest.fixture(scope="module")
def _uids(kmock_server: KMockServer) -> None:
    """Play the API server: every created object gets a uid (kmock leaves it out); below a
    test's own reactions (a 403, a 404), above kmock's default create."""
    import uuid

    km = kmock_server.km

    def assign_uid(request: Any) -> Any:
        meta = request.data.get("metadata") or {}
        obj = km.objects[request.resource, request.namespace or meta.get("namespace"), meta["name"]]
        if not (obj.get("metadata") or {}).get("uid"):
            obj.patch({"metadata": {"uid": str(uuid.uuid4())}})
        return obj.raw

    kmock_server.call(lambda: km["create"] ** -1 << assign_uid)


@pytest.fixture()
def api(srv: KMockServer, _uids: None) -> KMockServer:
    return srv


def _app_with_secrets(n: int = 2) -> specs.AppDef:
    app = echo_app(n=n)
    app.roles[0].env.update(
        {
            "PLAIN": "visible",
            "HF_TOKEN": HF_TOKEN,
            # what torchx injects for an MLflow server with credentials
            "MLFLOW_TRACKING_URI": f"https://alice:{URI_PASSWORD}@mlflow.example.com",
            "MLFLOW_TRACKING_PASSWORD": MLFLOW_PASSWORD,
        }
    )
    return app


def _stored_but_secrets(srv: KMockServer) -> str:
    """Every object the API server holds but Secrets (jobs, pods, services, claims), as JSON."""
    objs = [
        srv.get(res, NS, name)
        for res in (VOLCANO_JOBS, BATCH_JOBS, PODS, SERVICES, CONFIG_MAPS)
        for name in srv.names(res, NS)
    ]
    assert objs
    return json.dumps(objs)


@pytest.mark.parametrize("job_type", ["volcano", "indexed"])
def test_secret_env_is_in_no_job_or_pod_but_in_a_secret_the_job_owns(
    api: KMockServer, job_type: str
) -> None:
    runner = get_runner()
    key = "dag/train/secret" if job_type == "volcano" else None  # a claim holds nothing either
    handle = runner.run(
        _app_with_secrets(), "kubernetes", {"queue": "q", "job_type": job_type}, idempotency_key=key
    )
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    if job_type == "volcano":
        job = api.get(VOLCANO_JOBS, ns, name)
        assert job is not None
        volcano_pods(api, f"{ns}:{name}", ["Running", "Running"])
        templates = [t["template"] for t in job["spec"]["tasks"]]
    else:
        job = api.get(BATCH_JOBS, ns, f"{name}-echo")
        assert job is not None
        indexed_pods(api, ns, f"{name}-echo", ["Running", "Running"])
        templates = [job["spec"]["template"]]
    stored = _stored_but_secrets(api)
    for planted in (HF_TOKEN, MLFLOW_PASSWORD, URI_PASSWORD):
        assert planted not in stored
    assert "visible" in stored

    secret = api.get(SECRETS, ns, f"{name}-env")
    assert secret is not None
    assert secret["stringData"] == {
        "HF_TOKEN": HF_TOKEN,
        "MLFLOW_TRACKING_URI": f"https://alice:{URI_PASSWORD}@mlflow.example.com",
        "MLFLOW_TRACKING_PASSWORD": MLFLOW_PASSWORD,
    }
    assert job["metadata"]["uid"]
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": job["apiVersion"],
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
        }
    ]
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == name
    for template in templates:
        env = {e["name"]: e for e in container(template)["env"]}
        assert env["PLAIN"] == {"name": "PLAIN", "value": "visible"}
        for var in ("HF_TOKEN", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_PASSWORD"):
            ref = {"secretKeyRef": {"name": f"{name}-env", "key": var}}
            assert env[var] == {"name": var, "valueFrom": ref}
    desc = get_runner().describe(handle)  # from the cluster: no secret, no reference
    assert desc is not None and "HF_TOKEN" not in desc.roles[0].env


def test_an_existing_secret_is_named_for_a_variable(api: KMockServer) -> None:
    opts = create_scheduler("t").run_opts()
    cfg = opts.cfg_from_str("queue=q,secret_env=HF_TOKEN:hf-creds:token;WANDB_API_KEY:wandb")
    assert cfg["secret_env"] == {"HF_TOKEN": "hf-creds:token", "WANDB_API_KEY": "wandb"}
    app = echo_app()
    app.roles[0].env["HF_TOKEN"] = HF_TOKEN  # the named Secret wins over a value in clear
    handle = get_runner().run(app, "kubernetes", cfg)
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    assert HF_TOKEN not in _stored_but_secrets(api)
    assert api.names(SECRETS, ns) == []  # nothing else secret: the app needs no Secret of its own
    job = api.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    env = {e["name"]: e for e in container(job["spec"]["tasks"][0]["template"])["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-creds", "key": "token"}}
    assert env["WANDB_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "wandb", "key": "WANDB_API_KEY"}  # the key defaults to VAR
    }
    with pytest.raises(specs.InvalidRunConfigException, match="expected VAR:SECRET") as e:
        get_runner().dryrun(app, "kubernetes", {"queue": "q", "secret_env": {"X": "Bad_Name"}})
    assert "\n" not in str(e.value)


def test_a_refused_secret_leaves_no_job_behind(api: KMockServer) -> None:
    """An account without rights on Secrets: the job created first is deleted again."""
    api.call(lambda: api.km["post", re.compile(r"/api/v1/namespaces/nosecrets/secrets")] << 403)
    cfg = {"queue": "q", "namespace": "nosecrets"}
    with pytest.raises(KubernetesError, match="cannot create Secret .*-env .*403") as e:
        get_runner().run(_app_with_secrets(), "kubernetes", cfg)
    assert HF_TOKEN not in str(e.value) and "\n" not in str(e.value)
    assert api.names(VOLCANO_JOBS, "nosecrets") == []
    assert get_runner().run(echo_app(), "kubernetes", cfg)  # an app without secrets runs


def test_a_pod_waiting_for_its_apps_secret_is_pending_but_a_missing_named_one_fails(
    api: KMockServer,
) -> None:
    """The app's Secret follows its job: a pod that starts in between waits (the kubelet
    retries). A Secret the user named (``secret_env``) that does not exist never comes."""
    runner = get_runner()
    handle = runner.run(_app_with_secrets(n=1), "kubernetes", {"queue": "q"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    api.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    cases = [(f"{name}-env", specs.AppState.PENDING), ("hf-creds", specs.AppState.FAILED)]
    for secret, expected in cases:
        message = f'secret "{secret}" not found'
        waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
        volcano_pods(api, app_id, ["Pending"], containerStatuses=[{"name": "c", "state": waiting}])
        status = app_status(runner, handle)
        assert status.state == expected, secret
    assert 'CreateContainerConfigError: secret "hf-creds" not found' in status.msg
