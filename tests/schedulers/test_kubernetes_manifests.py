"""kubernetes scheduler manifests (dry runs): the Volcano Job and the Indexed Jobs + Service,
checked field by field and parsed back by the official client's models."""

from __future__ import annotations

import re
from typing import Any, Dict

import pytest
import yaml

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import InvalidAppError

from .kmock_server import (
    KMockServer,
    accepts,
    container,
    container_env,
    ddp_app,
    echo_app,
)

# --------------------------------------------------------------------------- manifests (dry run)


def test_ddp_volcano_manifest_key_fields(srv: KMockServer) -> None:
    info = get_runner().dryrun(ddp_app(), "kubernetes", {"queue": "research", "namespace": "ml"})
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
        accepts(tmpl, "V1PodTemplateSpec")
        c = container(tmpl)
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
        env = container_env(tmpl)
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert env["PYTHONUNBUFFERED"] == "1"  # prints reach the pod log (and stall checks)
        assert env["TORCHX_JOB_ID"] == f"kubernetes://torchx/ml:{job['metadata']['name']}"
    # rendezvous: rank 0 hosts on localhost, the others reach it through Volcano's svc plugin
    rank0, other = (container(t["template"])["command"][2] for t in tasks)
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in rank0
    assert container_env(tasks[0]["template"])["TORCHX_RANK0_HOST"] == "localhost"
    assert "--rdzv_endpoint ${VC_TRAIN_0_HOSTS:=localhost}:29500" in other
    assert "TORCHX_RANK0_HOST" not in container_env(tasks[1]["template"])
    # --dryrun output is YAML kubectl can apply: one document, the same manifest
    assert list(yaml.safe_load_all(str(info))) == [job]


def test_ddp_indexed_manifest_key_fields(srv: KMockServer) -> None:
    info = get_runner().dryrun(ddp_app(), "kubernetes", {"job_type": "indexed"})
    svc, job = info.request.manifests
    name = info.request.name
    accepts(svc, "V1Service")
    accepts(job, "V1Job")
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
    env = container_env(pod)
    assert list(env)[0] == "TORCHX_REPLICA_ID"
    assert env["TORCHX_REPLICA_ID"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["TORCHX_RANK0_HOST"] == f"{name}-train-0.{name}"  # stable pod DNS name of index 0
    assert env["PYTHONUNBUFFERED"] == "1"
    cmd = container(pod)["command"][2]
    assert "is_host=$([ ${TORCHX_REPLICA_ID} = 0 ]" in cmd  # bash reads the pod's index
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in cmd
    assert container(pod)["resources"]["requests"]["memory"] == "3687Mi"
    assert list(yaml.safe_load_all(str(info))) == [svc, job]


def test_non_shell_replica_id_uses_kubelet_expansion(srv: KMockServer) -> None:
    app = echo_app(n=3)
    app.roles[0].env["RID"] = specs.macros.replica_id
    app.roles[0].env["PYTHONUNBUFFERED"] = "0"  # the user's own value wins
    job = get_runner().dryrun(app, "kubernetes", {"job_type": "indexed"}).request.resource
    pod = job["spec"]["template"]
    assert container(pod)["command"] == ["echo", "hi", "$(TORCHX_REPLICA_ID)"]
    assert container_env(pod)["RID"] == "$(TORCHX_REPLICA_ID)"
    assert container_env(pod)["PYTHONUNBUFFERED"] == "0"


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
    accepts(tmpl, "V1PodTemplateSpec")
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
    c = container(tmpl)
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
    assert container_env(tmpl)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


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
    assert container(tmpl)["resources"]["requests"] == {"cpu": "900m", "memory": "922Mi"}


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
    assert [container(t["template"])["command"][2] for t in tasks] == [
        "echo ${TORCHX_RANK0_HOST}",
        "echo ${VC_PS_0_HOSTS}",
        "echo ${VC_PS_0_HOSTS}",
    ]
    info = runner.dryrun(app, "kubernetes", {"job_type": "indexed"})
    svc, j_ps, j_worker = info.request.manifests
    name = info.request.name
    assert [j["spec"]["completions"] for j in (j_ps, j_worker)] == [1, 2]
    for j in (j_ps, j_worker):
        assert container_env(j["spec"]["template"])["TORCHX_RANK0_HOST"] == f"{name}-ps-0.{name}"
        assert j["spec"]["template"]["spec"]["subdomain"] == name


@pytest.mark.parametrize(
    "app, cfg, needle",
    [
        (lambda: echo_app(), {}, "Required run option 'queue' is missing for job_type=volcano"),
        (lambda: echo_app(), {"job_type": "mcad"}, "'job_type' must be one of volcano, indexed"),
        (
            lambda: echo_app(),
            {"queue": "q", "tolerations": ["k=v:Sometimes"]},
            "effect must be NoSchedule",
        ),
        (
            lambda: echo_app(retry_policy=specs.RetryPolicy.ROLE),
            {"queue": "q"},
            "retry_policy ROLE is not supported",
        ),
        (
            lambda: specs.AppDef(
                "x",
                [
                    echo_app().roles[0],
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


def test_upstream_app_to_resource_helper(srv: KMockServer) -> None:
    from torchx.schedulers.kubernetes.scheduler import app_to_resource

    job = app_to_resource(echo_app(n=2), "q", "sa", priority_class="p")
    assert job["spec"]["queue"] == "q" and job["spec"]["priorityClassName"] == "p"
    assert [t["template"]["spec"]["serviceAccountName"] for t in job["spec"]["tasks"]] == [
        "sa",
        "sa",
    ]


def test_dryrun_shows_the_secrets_keys_never_its_values(srv: KMockServer) -> None:
    app = echo_app(n=2)
    app.roles[0].env.update(
        {
            "HF_TOKEN": "hf_planted_token_0001",
            "MLFLOW_TRACKING_URI": "https://alice:uri_planted_0002@mlflow.example.com",
            "API_KEY": f"key-{specs.macros.replica_id}-planted",  # differs per replica
        }
    )
    info = get_runner().dryrun(app, "kubernetes", {"queue": "q"})
    name = info.request.name
    for text in (str(info), repr(info.request)):
        assert "planted" not in text
    *jobs, secret = yaml.safe_load_all(str(info))
    assert jobs == [info.request.resource]
    assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", f"{name}-env")
    assert secret["stringData"] == {
        "HF_TOKEN": "***",
        "MLFLOW_TRACKING_URI": "***",
        "API_KEY": "***",
        "API_KEY.echo-1": "***",
    }
    accepts(info.request.secret, "V1Secret")
    assert info.request.secret is not None
    assert info.request.secret["stringData"]["API_KEY.echo-1"] == "key-1-planted"
    refs = [
        container_env(t["template"])["API_KEY"]["secretKeyRef"]
        for t in info.request.resource["spec"]["tasks"]
    ]
    assert refs == [
        {"name": f"{name}-env", "key": "API_KEY"},
        {"name": f"{name}-env", "key": "API_KEY.echo-1"},
    ]
