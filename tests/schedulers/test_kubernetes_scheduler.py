"""kubernetes scheduler against kmock, an in-memory Kubernetes API server the official
client talks HTTP to. There are no controllers: tests play Volcano / the Job controller /
the kubelet by writing job status, pods and pod logs into the emulator."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from torchx import specs
from torchx.components.dist import ddp
from torchx.runner import get_runner
from torchx.schedulers.api import InvalidAppError, Stream
from torchx.schedulers.kubernetes_scheduler import KubernetesError, create_scheduler

from .kmock_server import BATCH_JOBS, PODS, SERVICES, VOLCANO_JOBS, KMockServer

NS = "default"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[KMockServer]:
    with KMockServer() as srv:
        yield srv


@pytest.fixture()
def srv(server: KMockServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KMockServer:
    server.call(server.km.objects.clear)
    server.logs.clear()
    server.log_requests.clear()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return server


def _ddp() -> specs.AppDef:
    """The reference training stage: elastic DDP on 1 to 2 nodes x 2 processes."""
    return ddp(
        "--epochs",
        "1",
        script="train.py",
        j="1:2x2",
        cpu=2,
        gpu=2,
        memMB=4096,
        name="trainer",
        max_retries=2,
    )


def _echo(name: str = "echo", n: int = 1, **kw: Any) -> specs.AppDef:
    role = specs.Role(
        name="echo",
        image="alpine",
        entrypoint="echo",
        args=["hi", specs.macros.replica_id],
        num_replicas=n,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        **kw,
    )
    return specs.AppDef(name=name, roles=[role])


def _accepts(manifest: Dict[str, Any], model: str) -> Any:
    """The official client parses the manifest into ``model`` and writes back the same data."""
    from kubernetes.client import ApiClient

    class _Resp:
        data = json.dumps(manifest)

    api = ApiClient()
    obj = api.deserialize(_Resp(), model)
    assert api.sanitize_for_serialization(obj) == manifest
    return obj


def _container(template: Dict[str, Any]) -> Dict[str, Any]:
    return template["spec"]["containers"][0]


def _env(template: Dict[str, Any]) -> Dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(template)["env"]}


def _status(runner: Any, handle: str) -> specs.AppStatus:
    status = runner.status(handle)
    assert status is not None, handle
    return status


# --------------------------------------------------------------------------- emulated controllers


def _volcano_pods(srv: KMockServer, app_id: str, phases: List[str], **status: Any) -> None:
    """Play Volcano + kubelet: one pod per task, named ``{job}-{task}-0``, in ``phases``."""
    ns, name = app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    for task, phase in zip(job["spec"]["tasks"], phases, strict=False):
        tmpl = task["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**tmpl["metadata"], "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {
                **tmpl["spec"],
                "nodeName": "node-1",
                "hostname": f"{name}-{task['name']}-0",
                "subdomain": name,
            },
            "status": {"phase": phase, **status},
        }
        srv.put(PODS, ns, f"{name}-{task['name']}-0", pod)


def _indexed_pods(
    srv: KMockServer, ns: str, job_name: str, phases: List[str], **status: Any
) -> List[str]:
    """Play the Job controller + kubelet for an Indexed Job."""
    job = srv.get(BATCH_JOBS, ns, job_name)
    assert job is not None
    tmpl = job["spec"]["template"]
    names = []
    for i, phase in enumerate(phases):
        meta = {
            "labels": {
                **tmpl["metadata"]["labels"],
                "batch.kubernetes.io/job-completion-index": str(i),
                "job-name": job_name,
            },
            "annotations": {
                **tmpl["metadata"]["annotations"],
                "batch.kubernetes.io/job-completion-index": str(i),
            },
            "creationTimestamp": "2025-01-01T00:00:00Z",
        }
        pod_name = f"{job_name}-{i}-abcde"
        srv.put(
            PODS,
            ns,
            pod_name,
            {
                "metadata": meta,
                "spec": {**tmpl["spec"], "nodeName": f"node-{i}"},
                "status": {"phase": phase, **status},
            },
        )
        names.append(pod_name)
    return names


def _replica_states(status: specs.AppStatus) -> Dict[str, List[specs.AppState]]:
    return {r.role: [x.state for x in r.replicas] for r in status.roles}


# --------------------------------------------------------------------------- manifests (dry run)


def test_ddp_volcano_manifest_key_fields(srv: KMockServer) -> None:
    info = get_runner().dryrun(_ddp(), "kubernetes", {"queue": "research", "namespace": "ml"})
    req = info.request
    job = req.resource
    assert (job["apiVersion"], job["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    assert job["metadata"]["namespace"] == "ml" and re.fullmatch(
        r"trainer-[a-z0-9]{8}", job["metadata"]["name"]
    )
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "research"
    assert spec["minAvailable"] == 1  # -j 1:2 -> gang of at least 1 node
    assert spec["plugins"] == {"svc": ["--publish-not-ready-addresses"], "env": []}
    assert spec["maxRetry"] == 2
    tasks = spec["tasks"]
    assert [t["name"] for t in tasks] == ["train-0", "train-1"]
    assert [t["replicas"] for t in tasks] == [1, 1]
    assert [t["minAvailable"] for t in tasks] == [1, 0]
    assert tasks[0]["policies"] == [
        {"event": "PodEvicted", "action": "RestartJob"},
        {"event": "PodFailed", "action": "RestartJob"},
    ]
    for i, task in enumerate(tasks):
        tmpl = task["template"]
        _accepts(tmpl, "V1PodTemplateSpec")
        c = _container(tmpl)
        assert c["resources"] == {
            "limits": {"cpu": "2000m", "memory": "4096Mi", "nvidia.com/gpu": "2"},
            "requests": {"cpu": "1900m", "memory": "3687Mi", "nvidia.com/gpu": "2"},
        }
        assert c["command"][:2] == ["bash", "-c"]
        cmd = c["command"][2]
        assert (
            "torchrun" in cmd
            and "--nnodes 1:2" in cmd
            and "--nproc_per_node 2" in cmd
            and "train.py --epochs 1" in cmd
        )
        assert f"is_host=$([ {i} = 0 ]" in cmd
        labels = tmpl["metadata"]["labels"]
        assert labels["torchx.pytorch.org/role-name"] == "train" and labels[
            "torchx.pytorch.org/replica-id"
        ] == str(i)
        assert labels["app.kubernetes.io/instance"] == job["metadata"]["name"]
        assert tmpl["spec"]["restartPolicy"] == "Never"
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4096Mi"}} in tmpl[
            "spec"
        ]["volumes"]
        env = _env(tmpl)
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert env["TORCHX_JOB_ID"] == f"kubernetes://torchx/ml:{job['metadata']['name']}"
    # rendezvous: rank 0 hosts on localhost, the others reach it through Volcano's svc plugin
    rank0, other = (_container(t["template"])["command"][2] for t in tasks)
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in rank0
    assert _env(tasks[0]["template"])["TORCHX_RANK0_HOST"] == "localhost"
    assert "--rdzv_endpoint ${VC_TRAIN_0_HOSTS:=localhost}:29500" in other
    assert "TORCHX_RANK0_HOST" not in _env(tasks[1]["template"])
    # --dryrun output is YAML kubectl can apply: one document, the same manifest
    assert list(yaml.safe_load_all(str(info))) == [job]


def test_ddp_indexed_manifest_key_fields(srv: KMockServer) -> None:
    info = get_runner().dryrun(_ddp(), "kubernetes", {"job_type": "indexed"})
    svc, job = info.request.manifests
    name = info.request.name
    _accepts(svc, "V1Service")
    _accepts(job, "V1Job")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"app.kubernetes.io/instance": name}
    assert job["metadata"]["name"] == f"{name}-train"
    spec = job["spec"]
    assert (
        spec["completionMode"],
        spec["completions"],
        spec["parallelism"],
        spec["backoffLimit"],
    ) == ("Indexed", 2, 2, 2)
    pod = spec["template"]
    assert pod["spec"]["subdomain"] == name
    env = _env(pod)
    assert list(env)[0] == "TORCHX_REPLICA_ID"
    assert env["TORCHX_REPLICA_ID"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["TORCHX_RANK0_HOST"] == f"{name}-train-0.{name}"  # stable pod DNS name of index 0
    cmd = _container(pod)["command"][2]
    assert "is_host=$([ ${TORCHX_REPLICA_ID} = 0 ]" in cmd  # bash reads the pod's index
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in cmd
    assert _container(pod)["resources"]["requests"]["memory"] == "3687Mi"
    assert list(yaml.safe_load_all(str(info))) == [svc, job]


def test_non_shell_replica_id_uses_kubelet_expansion(srv: KMockServer) -> None:
    app = _echo(n=3)
    app.roles[0].env["RID"] = specs.macros.replica_id
    job = get_runner().dryrun(app, "kubernetes", {"job_type": "indexed"}).request.resource
    pod = job["spec"]["template"]
    assert _container(pod)["command"] == ["echo", "hi", "$(TORCHX_REPLICA_ID)"]
    assert _env(pod)["RID"] == "$(TORCHX_REPLICA_ID)"


def test_mounts_devices_resources_and_pod_options(srv: KMockServer) -> None:
    role = specs.Role(
        name="trainer",
        image="repo/img:1",
        entrypoint="python",
        args=["-m", "x"],
        env={"POD_IP": "[FIELD_PATH]status.podIP"},
        resource=specs.Resource(
            cpu=96,
            gpu=8,
            memMB=1_179_648,
            capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
            devices={"vpc.amazonaws.com/efa": 4},
        ),
        mounts=[
            specs.BindMount("/data", "/mnt/data", read_only=True),
            specs.VolumeMount("my-pvc", "/ckpt"),
            specs.DeviceMount("/dev/fuse", "/dev/fuse"),
        ],
        retry_policy=specs.RetryPolicy.REPLICA,
        max_retries=3,
    )
    cfg: Dict[str, specs.CfgVal] = {
        "queue": "q",
        "service_account": "trainer-sa",
        "priority_class": "high",
        "node_selector": {"disktype": "ssd"},
        "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute", "*"],
        "image_pull_secrets": ["regcred"],
    }
    job = get_runner().dryrun(specs.AppDef("big", [role]), "kubernetes", cfg).request.resource
    assert job["spec"]["priorityClassName"] == "high"
    task = job["spec"]["tasks"][0]
    assert task["maxRetry"] == 3 and "minAvailable" not in task
    assert task["policies"] == [
        {"event": "PodEvicted", "action": "RestartTask"},
        {"event": "PodFailed", "action": "RestartTask"},
    ]
    tmpl = task["template"]
    _accepts(tmpl, "V1PodTemplateSpec")
    pod = tmpl["spec"]
    assert pod["serviceAccountName"] == "trainer-sa"
    assert pod["nodeSelector"] == {
        "disktype": "ssd",
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
    }
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        {"operator": "Exists"},
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["mount-0"] == {"name": "mount-0", "hostPath": {"path": "/data"}}
    assert vols["mount-1"] == {
        "name": "mount-1",
        "persistentVolumeClaim": {"claimName": "my-pvc", "readOnly": False},
    }
    assert vols["mount-2"] == {"name": "mount-2", "hostPath": {"path": "/dev/fuse"}}
    c = _container(tmpl)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["mount-0"] == {"name": "mount-0", "mountPath": "/mnt/data", "readOnly": True}
    assert mounts["mount-1"]["mountPath"] == "/ckpt" and mounts["dshm"]["mountPath"] == "/dev/shm"
    assert c["securityContext"] == {"privileged": True}  # device mounts need it
    assert c["resources"]["limits"] == {
        "cpu": "96000m",
        "memory": "1179648Mi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
    }
    # big roles keep upstream's 100m / 1 GiB headroom for node daemons
    assert c["resources"]["requests"] == {
        "cpu": "95900m",
        "memory": "1178624Mi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
    }
    assert _env(tmpl)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_small_role_requests_are_not_starved(srv: KMockServer) -> None:
    # upstream requested memMB - 1024 = 0M for a 1 GiB role
    role = specs.Role(
        "w", "img", entrypoint="true", resource=specs.Resource(cpu=1, gpu=0, memMB=1024)
    )
    tmpl = (
        get_runner()
        .dryrun(specs.AppDef("s", [role]), "kubernetes", {"queue": "q"})
        .request.resource["spec"]["tasks"][0]["template"]
    )
    assert _container(tmpl)["resources"]["requests"] == {"cpu": "900m", "memory": "922Mi"}


def test_multi_role_rendezvous_hosts(srv: KMockServer) -> None:
    ps = specs.Role(
        "ps",
        "img",
        entrypoint="bash",
        args=["-c", f"echo $${{{specs.macros.rank0_env}}}"],
        num_replicas=1,
        resource=specs.Resource(1, 0, 512),
    )
    worker = specs.Role(
        "worker_role",
        "img",
        entrypoint="bash",
        args=["-c", f"echo $${{{specs.macros.rank0_env}}}"],
        num_replicas=2,
        resource=specs.Resource(1, 0, 512),
    )
    app = specs.AppDef("multi", [ps, worker])
    runner = get_runner()
    tasks = runner.dryrun(app, "kubernetes", {"queue": "q"}).request.resource["spec"]["tasks"]
    assert [t["name"] for t in tasks] == ["ps-0", "worker-role-0", "worker-role-1"]
    assert [_container(t["template"])["command"][2] for t in tasks] == [
        "echo ${TORCHX_RANK0_HOST}",
        "echo ${VC_PS_0_HOSTS}",
        "echo ${VC_PS_0_HOSTS}",
    ]
    info = runner.dryrun(app, "kubernetes", {"job_type": "indexed"})
    svc, j_ps, j_worker = info.request.manifests
    name = info.request.name
    assert [j["spec"]["completions"] for j in (j_ps, j_worker)] == [1, 2]
    for j in (j_ps, j_worker):
        assert _env(j["spec"]["template"])["TORCHX_RANK0_HOST"] == f"{name}-ps-0.{name}"
        assert j["spec"]["template"]["spec"]["subdomain"] == name


@pytest.mark.parametrize(
    "app, cfg, needle",
    [
        (lambda: _echo(), {}, "Required run option 'queue' is missing for job_type=volcano"),
        (lambda: _echo(), {"job_type": "mcad"}, "'job_type' must be one of volcano, indexed"),
        (
            lambda: _echo(),
            {"queue": "q", "tolerations": ["k=v:Sometimes"]},
            "effect must be NoSchedule",
        ),
        (
            lambda: _echo(retry_policy=specs.RetryPolicy.ROLE),
            {"queue": "q"},
            "retry_policy ROLE is not supported",
        ),
        (
            lambda: specs.AppDef(
                "x",
                [
                    _echo().roles[0],
                    specs.Role("Echo", "i", entrypoint="e", resource=specs.Resource(1, 0, 1)),
                ],
            ),
            {"queue": "q"},
            "map to the same Kubernetes name 'echo'",
        ),
    ],
)
def test_bad_config_is_one_specific_error(
    srv: KMockServer, app: Any, cfg: Dict[str, Any], needle: str
) -> None:
    with pytest.raises((specs.InvalidRunConfigException, InvalidAppError)) as e:
        get_runner().dryrun(app(), "kubernetes", cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- lifecycle in kmock


def test_volcano_submit_status_list_through_runner(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_ddp(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    assert ns == NS
    stored = srv.get(VOLCANO_JOBS, ns, name)
    assert stored is not None and stored["spec"]["tasks"][1]["minAvailable"] == 0

    assert (
        _status(runner, handle).state == specs.AppState.SUBMITTED
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
    status = _status(runner, handle)
    assert status.state == specs.AppState.PENDING
    assert _replica_states(status) == {"train": [specs.AppState.PENDING, specs.AppState.PENDING]}

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    _volcano_pods(srv, app_id, ["Running", "Pending"])
    status = _status(runner, handle)
    assert status.state == specs.AppState.RUNNING
    assert _replica_states(status) == {"train": [specs.AppState.RUNNING, specs.AppState.PENDING]}
    assert status.roles[0].replicas[0].hostname == "node-1"

    srv.patch(
        VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Restarting"}, "retryCount": 1}}
    )
    assert _status(runner, handle).num_restarts == 1

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Completed"}}})
    _volcano_pods(srv, app_id, ["Succeeded", "Succeeded"])
    done = runner.wait(handle, wait_interval=0.1, timeout=10)
    assert done is not None and done.state == specs.AppState.SUCCEEDED
    assert _replica_states(done) == {"train": [specs.AppState.SUCCEEDED] * 2}

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
    handle = runner.run(_echo(), "kubernetes", {"queue": "q"})
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
        assert _status(runner, handle).state == state, phase


def test_describe_reads_limits_with_the_one_quantity_parser(srv: KMockServer) -> None:
    """A job edited with kubectl to decimal units reads back as Kubernetes means them."""
    sched = create_scheduler("test")
    app_id = sched.submit(_echo(), {"queue": "q"})
    ns, name = app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    _container(job["spec"]["tasks"][0]["template"])["resources"]["limits"] = {
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
    handle = runner.run(_ddp(), "kubernetes", {"queue": "default"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    runner.cancel(handle)
    assert srv.get(VOLCANO_JOBS, ns, name) is None
    assert _status(runner, handle).state == specs.AppState.CANCELLED  # this process deleted it
    assert get_runner().status(handle) is None  # elsewhere: gone from the cluster
    runner.cancel(handle)  # idempotent


def test_bad_image_fails_instead_of_pending_forever(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_ddp(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    waiting = {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "ghcr.io/nope:1"',
        }
    }
    _volcano_pods(
        srv, app_id, ["Pending", "Pending"], containerStatuses=[{"name": "c", "state": waiting}]
    )
    status = _status(runner, handle)
    assert status.state == specs.AppState.FAILED
    assert 'train[0]: ImagePullBackOff: Back-off pulling image "ghcr.io/nope:1"' in status.msg
    assert "ImagePullBackOff" in status.error_summary()
    assert _replica_states(status) == {"train": [specs.AppState.FAILED] * 2}


def test_unschedulable_and_oom_reasons_are_surfaced(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_echo(n=1), "kubernetes", {"queue": "q"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    _volcano_pods(srv, app_id, ["Pending"], conditions=[cond])
    status = _status(runner, handle)
    assert status.state == specs.AppState.PENDING  # the cluster may still scale up
    assert (
        status.msg
        == "echo[0]: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )

    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    _volcano_pods(srv, app_id, ["Failed"], containerStatuses=[{"name": "c", "state": oom}])
    status = _status(runner, handle)
    assert status.state == specs.AppState.FAILED
    assert "OOMKilled" in status.roles[0].replicas[0].structured_error_msg
    assert "OOMKilled" in status.error_summary()


def test_indexed_lifecycle_through_runner(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_ddp(), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    job_name = f"{name}-train"
    assert srv.get(SERVICES, ns, name) is not None and srv.get(BATCH_JOBS, ns, job_name) is not None
    assert srv.names(VOLCANO_JOBS) == []
    assert _status(runner, handle).state == specs.AppState.SUBMITTED

    srv.patch(BATCH_JOBS, ns, job_name, {"status": {"active": 2, "ready": 1}})
    _indexed_pods(srv, ns, job_name, ["Running", "Pending"])
    status = _status(runner, handle)
    assert status.state == specs.AppState.RUNNING
    assert _replica_states(status) == {"train": [specs.AppState.RUNNING, specs.AppState.PENDING]}
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
    _indexed_pods(srv, ns, job_name, ["Failed", "Running"])
    status = _status(runner, handle)
    assert status.state == specs.AppState.FAILED and status.num_restarts == 3
    assert status.msg == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    listed = {a.app_handle: a.state for a in get_runner().list("kubernetes")}
    assert listed[handle] == specs.AppState.FAILED
    app = get_runner().describe(handle)
    assert app is not None and [(r.name, r.num_replicas) for r in app.roles] == [("train", 2)]


def test_indexed_cancel_deletes_jobs_and_service(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_echo(n=2), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    runner.cancel(handle)
    assert srv.get(BATCH_JOBS, ns, f"{name}-echo") is None and srv.get(SERVICES, ns, name) is None
    assert _status(runner, handle).state == specs.AppState.CANCELLED


def test_list_only_shows_torchx_apps(srv: KMockServer) -> None:
    srv.put(
        VOLCANO_JOBS,
        NS,
        "someone-else",
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {}},
    )
    srv.put(BATCH_JOBS, NS, "cron-job", {"apiVersion": "batch/v1", "kind": "Job", "spec": {}})
    runner = get_runner()
    h1 = runner.run(_echo(), "kubernetes", {"queue": "q"})
    h2 = runner.run(_echo(), "kubernetes", {"job_type": "indexed"})
    assert sorted(a.app_handle for a in runner.list("kubernetes")) == sorted([h1, h2])


def test_unknown_app_and_bad_app_id(srv: KMockServer) -> None:
    runner = get_runner()
    assert runner.status("kubernetes://torchx/default:nope-12345678") is None
    with pytest.raises(specs.InvalidArgumentError, match="expected NAMESPACE:NAME"):
        runner.status("kubernetes://torchx/nocolon")


def test_conflict_and_missing_volcano_are_clear_errors(srv: KMockServer) -> None:
    runner = get_runner()
    info = runner.dryrun(_echo(), "kubernetes", {"queue": "q"})
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
        runner.run(_echo(), "kubernetes", {"queue": "q", "namespace": "novolcano"})


def test_no_kubeconfig_or_no_server_is_one_line(
    srv: KMockServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = get_runner().dryrun(_echo(), "kubernetes", {"queue": "q"})  # a dry run needs no cluster
    assert info.request.namespace == "default"
    with pytest.raises(KubernetesError, match="no Kubernetes configuration found"):
        get_runner().schedule(info)
    dead = KMockServer.__new__(KMockServer)
    dead.url = "http://127.0.0.1:1"
    monkeypatch.setenv("KUBECONFIG", str(dead.write_kubeconfig(tmp_path / "dead")))
    with pytest.raises(KubernetesError, match="cannot reach the Kubernetes API server"):
        get_runner().status("kubernetes://torchx/default:x")


# --------------------------------------------------------------------------- logs


LOG = "step 1 loss=0.9\nhéllo ✓ unicode\n\nstep 2 loss=0.5\nno newline at end"


def test_logs_keep_newlines_and_follow_streams_lines(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_ddp(), "kubernetes", {"queue": "default"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    _volcano_pods(srv, app_id, ["Running", "Running"])
    srv.set_log(ns, f"{name}-train-1-0", LOG)
    expected = [
        "step 1 loss=0.9\n",
        "héllo ✓ unicode\n",
        "\n",
        "step 2 loss=0.5\n",
        "no newline at end",
    ]
    assert list(runner.log_lines(handle, "train", 1)) == expected
    # follow: the emulator sends 7-byte chunks that split lines and UTF-8 characters
    assert list(runner.log_lines(handle, "train", 1, should_tail=True)) == expected
    assert srv.log_requests[-1].get("follow", "").lower() == "true"
    assert list(runner.log_lines(handle, "train", 1, regex="loss")) == [expected[0], expected[3]]
    assert list(runner.log_lines(handle, "train", 0)) == []  # no log yet for replica 0
    with pytest.raises(specs.InvalidArgumentError, match="--streams combined"):
        list(runner.log_lines(handle, "train", 1, streams=Stream.STDERR))


def test_indexed_logs_find_the_pod_by_index(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_echo(n=2), "kubernetes", {"job_type": "indexed"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    pods = _indexed_pods(srv, ns, f"{name}-echo", ["Running", "Running"])
    srv.set_log(ns, pods[1], "hi 1\n")
    assert list(runner.log_lines(handle, "echo", 1)) == ["hi 1\n"]


def test_tail_waits_for_the_pod_to_start(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_echo(), "kubernetes", {"queue": "q"})
    app_id = specs.parse_app_handle(handle).app_id
    ns, name = app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Pending"}}})
    lines: List[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(runner.log_lines(handle, "echo", 0, should_tail=True)),
        daemon=True,
    )
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and lines == []  # no pod yet: keeps waiting while the app is pending
    srv.set_log(ns, f"{name}-echo-0-0", "hi 0\n")
    _volcano_pods(srv, app_id, ["Running"])
    reader.join(timeout=20)
    assert not reader.is_alive() and lines == ["hi 0\n"]


def test_tail_of_a_finished_app_without_pods_returns(srv: KMockServer) -> None:
    runner = get_runner()
    handle = runner.run(_echo(), "kubernetes", {"queue": "q"})
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Failed"}}})
    assert list(runner.log_lines(handle, "echo", 0, should_tail=True)) == []


# --------------------------------------------------------------------------- CLI and missing extra


def _tx(
    args: List[str], env: Dict[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def test_cli_dryrun_run_status_list_cancel(srv: KMockServer, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = _tx(
        [
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=default",
            "--dryrun",
            "dist.ddp",
            "-j",
            "1:2x2",
            "--script",
            "train.py",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    manifest = out.stdout.split("=== SCHEDULER REQUEST ===\n", 1)[1]
    (job,) = yaml.safe_load_all(manifest)
    assert job["kind"] == "Job" and [t["minAvailable"] for t in job["spec"]["tasks"]] == [1, 0]
    assert srv.names(VOLCANO_JOBS) == []  # a dry run submits nothing

    out = _tx(
        [
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=default",
            "dist.ddp",
            "-j",
            "1:2x2",
            "--script",
            "train.py",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip().splitlines()[-1]
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    assert srv.get(VOLCANO_JOBS, ns, name) is not None
    srv.patch(VOLCANO_JOBS, ns, name, {"status": {"state": {"phase": "Running"}}})
    _volcano_pods(srv, f"{ns}:{name}", ["Running", "Pending"])

    out = _tx(["status", handle], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        "State: RUNNING" in out.stdout
        and "train[0]:RUNNING" in out.stdout
        and "train[1]:PENDING" in out.stdout
    )
    out = _tx(["list", "-s", "kubernetes"], env, tmp_path)
    assert out.returncode == 0 and handle in out.stdout and "RUNNING" in out.stdout
    srv.set_log(ns, f"{name}-train-1-0", "epoch 1\nepoch 2\n")
    out = _tx(["log", f"{handle}/train/1"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["train/1 epoch 1", "train/1 epoch 2"]
    out = _tx(["cancel", handle], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"{handle} CANCELLED" in out.stdout
    assert srv.get(VOLCANO_JOBS, ns, name) is None


def test_cli_missing_queue_is_one_line(srv: KMockServer, tmp_path: Path) -> None:
    out = _tx(
        ["run", "-s", "kubernetes", "--dryrun", "utils.echo"],
        dict(os.environ, PYTHONPATH=str(REPO)),
        tmp_path,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "torchx: error: Required run option 'queue' is missing for job_type=volcano;"
        " pass -cfg queue=QUEUE"
        " (a Volcano queue, e.g. default) or -cfg job_type=indexed. Given run configs: {}"
    ]


BLOCKED = (
    "import sys; sys.modules['kubernetes'] = None; "
    "from torchx.cli.main import main; main(sys.argv[1:])"
)


def test_missing_kubernetes_extra_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCKED,
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=q",
            "--dryrun",
            "utils.echo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "torchx: error: 'kubernetes' is not installed;"
        " install it with: pip install 'torchx[kubernetes]'"
    ]


def test_upstream_app_to_resource_helper(srv: KMockServer) -> None:
    from torchx.schedulers.kubernetes_scheduler import app_to_resource

    job = app_to_resource(_echo(n=2), "q", "sa", priority_class="p")
    assert job["spec"]["queue"] == "q" and job["spec"]["priorityClassName"] == "p"
    assert [t["template"]["spec"]["serviceAccountName"] for t in job["spec"]["tasks"]] == [
        "sa",
        "sa",
    ]


def test_scheduler_accepts_an_injected_client(srv: KMockServer) -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = srv.url
    api = client.ApiClient(cfg)
    sched = create_scheduler("s", client=api, namespace="team-a")
    app_id = sched.submit(_echo(), {"queue": "q"})
    assert app_id.startswith("team-a:")
    assert [a.app_id for a in sched.list()] == [app_id]
    sched.close()  # not ours: the caller's client stays open
    assert client.CoreV1Api(api).list_namespaced_pod("team-a").items == []
